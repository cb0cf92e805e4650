"""Resume after a kill, backoff excluded: cold drivers against warm ones, back to back.

    python -m bench.resume [--backends local,spacesd] [--kills 12] [--rounds 2]
                           [--kill-after 0.1]

The campaign's own driver (``python -m durable_spaces.campaigns.agent``, transactional
mode, one Space) re-driven by a ``Coordinator``: each driver is SIGKILLed 0.1-0.2 s
(``--kill-after``) after its first step; the next driver's first step ends the resume.
The figure is the campaign report's "p50 excl. backoff" column
(``Resume.latency_excl_backoff_ms``: the coordinator's kill to the next driver's
``first_step`` event, minus the backoff slept; SUMMARY's ``resume_p50_ms`` keeps the
backoff in). Cold (``warm=False``) and warm
(``warm=True``) alternate per round so that a loaded machine weighs on both alike.
Prints one line per backend and mode::

    RESUME backend=<b> warm=<0|1> kills=<n> p50_ms=<x> p95_ms=<x> warm_launches=<n>
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

from durable_spaces.backends import unavailable_reason
from durable_spaces.campaigns.agent import AgentConfigFile
from durable_spaces.campaigns.summary import percentile
from durable_spaces.drive.coordinator import Coordinator

#: Seconds after a driver's first step that it is killed (plus up to 0.1 s drawn).
KILL_AFTER_S = 0.1
AGENT = [sys.executable, "-m", "durable_spaces.campaigns.agent"]


async def resumes(backend: str, kills: int, warm: bool, seed: str) -> tuple[list[float], int]:
    """Resume latencies (backoff excluded) of ``kills`` kills, and how many launches
    took a warm driver."""
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as d:
        root = Path(d)
        AgentConfigFile(
            backend=backend,
            backend_dir=str(root / "spaces"),
            mode="transactional",
            seed=seed,
            calls=kills * max(3, int(KILL_AFTER_S * 40)) + 6,  # enough to outlast the kills
            store_dir=str(root / "store"),
        ).save(root / "session")
        c = Coordinator(
            AGENT,
            root / "session",
            "bench-resume",
            stall_secs=60,
            heartbeat_secs=2,
            backoff=(0.05, 0.05, 1.0),
            max_attempts=kills + 4,
            env={"CUA_SESSION_SPACE": "bench-resume"},
            warm=warm,
        )
        rng = random.Random(seed)

        async def killer() -> None:
            n = 0
            async for a in c.attempts():
                while a.alive and a.first_step_ms is None:
                    await asyncio.sleep(0.005)
                if n < kills and a.alive:
                    await asyncio.sleep(KILL_AFTER_S + 0.1 * rng.random())
                    if c.kill_current("nemesis") is not None:
                        n += 1

        task = asyncio.create_task(killer())
        try:
            res = await c.run()
        finally:
            task.cancel()
        if res.status != "done":
            raise SystemExit(f"bench.resume: the session ended {res.status}: {res.reason}")
        launches = sum(1 for a in c.history if a.warm)
        return [r.latency_excl_backoff_ms for r in res.resumes], launches


def main() -> None:
    global KILL_AFTER_S
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="local,spacesd")
    ap.add_argument("--kills", type=int, default=12, help="kills per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kill-after", type=float, default=KILL_AFTER_S, help="seconds")
    args = ap.parse_args()
    KILL_AFTER_S = args.kill_after
    for backend in args.backends.split(","):
        reason = unavailable_reason(backend)
        if reason is not None:
            print(f"RESUME backend={backend} skipped: {reason}")
            continue
        got: dict[bool, tuple[list[float], int]] = {False: ([], 0), True: ([], 0)}
        for r in range(args.rounds):
            for warm in (False, True) if r % 2 == 0 else (True, False):
                xs, n = asyncio.run(resumes(backend, args.kills, warm, f"bench-{r}"))
                got[warm] = (got[warm][0] + xs, got[warm][1] + n)
        for warm, (xs, n) in got.items():
            p50, p95 = percentile(xs, 50), percentile(xs, 95)
            print(
                f"RESUME backend={backend} warm={int(warm)} kills={len(xs)} "
                f"p50_ms={p50 or 0:.0f} p95_ms={p95 or 0:.0f} warm_launches={n}",
                flush=True,
            )


if __name__ == "__main__":
    main()
