"""What the coordinator itself costs: epoch issue, and resume after a driver kill.

    python -m bench.coordinator [--kills N] [--backoff 0.05]

A minimal driver (a Python process that heartbeats, prints its first step and waits) is
SIGKILLed by ``kill_current`` 0.2 s after each first step; the next driver's first step
ends the resume. Reported: resume latency p50/p95 with the backoff and with the backoff
excluded (what is left is the coordinator's reaping, the durable epoch issue and a
Python driver's cold start), and the cost of one durable epoch issue (lock, write,
fsync, rename, directory fsync). No session, no Space: the floor under every campaign.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time

from durable_spaces.campaigns.summary import percentile
from durable_spaces.drive.coordinator import Coordinator

DRIVER = r"""
import json, os, sys, threading, time
epoch = int(os.environ["CUA_SESSION_EPOCH"])
lock = threading.Lock()
def say(s):
    with lock:
        sys.stdout.write(s + "\n"); sys.stdout.flush()
def beat():
    while True:
        say(f"CUA-HEARTBEAT {epoch} {int(time.time() * 1000)}")
        time.sleep(float(os.environ["CUA_SESSION_HEARTBEAT_SECS"]))
threading.Thread(target=beat, daemon=True).start()
say("DS-EVENT " + json.dumps({"event": "first_step", "unix_ms": time.time() * 1000}))
if epoch > int(os.environ["BENCH_KILLS"]):
    sys.exit(0)
time.sleep(3600)
"""


async def resumes(kills: int, backoff: float) -> tuple[list[float], list[float], float]:
    with tempfile.TemporaryDirectory() as d:
        c = Coordinator(
            [sys.executable, "-c", DRIVER],
            d,
            "bench",
            stall_secs=30,
            heartbeat_secs=1,
            backoff=(backoff, backoff, 1.0),
            max_attempts=kills + 2,
            env={"BENCH_KILLS": str(kills)},
        )

        async def killer() -> None:
            async for a in c.attempts():
                while a.alive and a.first_step_ms is None:
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.2)
                c.kill_current()

        task = asyncio.create_task(killer())
        t0 = time.monotonic()
        res = await c.run()
        wall = time.monotonic() - t0
        task.cancel()
        assert res.status == "done", res
        return res.resume_latencies_ms, [r.latency_excl_backoff_ms for r in res.resumes], wall


def epoch_issue_ms(n: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        c = Coordinator(["true"], d, "bench")
        t0 = time.perf_counter()
        for _ in range(n):
            c._issue_epoch()
        return (time.perf_counter() - t0) * 1000 / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--backoff", type=float, default=0.05)
    args = ap.parse_args()
    lat, net, wall = asyncio.run(resumes(args.kills, args.backoff))

    def fmt(xs: list[float]) -> str:
        p50, p95 = percentile(xs, 50), percentile(xs, 95)
        return f"p50={p50:.0f} ms p95={p95:.0f} ms mean={statistics.mean(xs):.0f} ms"

    print(f"resumes: {len(lat)} kills in {wall:.1f} s (backoff {args.backoff * 1000:.0f} ms)")
    print(f"resume latency (kill -> next first step):  {fmt(lat)}")
    print(f"resume latency, backoff excluded:          {fmt(net)}")
    issue = epoch_issue_ms(50)
    print(f"durable epoch issue (lock+fsync+rename):   {issue:.2f} ms")
    p50 = percentile(net, 50) or 0.0
    print(f"ratio epoch issue / resume (excl backoff): {issue / p50:.3f}")


if __name__ == "__main__":
    main()
