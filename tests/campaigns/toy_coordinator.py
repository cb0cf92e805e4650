"""Runs a Coordinator over the toy driver as its own process (to be SIGKILLed by a test).

Usage: python toy_coordinator.py STATE_DIR; TOY_PLAN is passed through to the drivers.
Prints the result as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from durable_spaces.drive.coordinator import Coordinator

HERE = os.path.dirname(os.path.abspath(__file__))


async def main(state_dir: str) -> None:
    c = Coordinator(
        [sys.executable, os.path.join(HERE, "toy_driver.py")],
        state_dir,
        "toy",
        stall_secs=5,
        heartbeat_secs=0.1,
        backoff=(0.05, 0.2, 2),
        max_attempts=5,
        timeout_secs=60,
    )
    r = await c.run()
    print(
        json.dumps(
            {
                "status": r.status,
                "epochs": r.epochs,
                "codes": r.exit_codes,
                "events": [e["event"] for e in r.events],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
