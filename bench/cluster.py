"""Re-driving across hosts: resume after a driver kill, and re-placing a lost host's Space.

    python -m bench.cluster [--kills 5] [--losses 3] [--backoff 2,60,2]

A real cluster on this machine (``durable_spaces/campaigns/cluster/lab.py``): a private PostgreSQL,
host agents with cua-spacesd in network namespaces, one coordinator process, scripted
transactional sessions (8 steps). Needs root (``ip netns``).

- resume: a driver is SIGKILLed 0.5 s after its first step; from the kill to the next
  driver's first step (the coordinator's reaping, the backoff, ``begin_drive``, asking
  the Space's host, a cold driver start, recovery). Shown with and without the backoff,
  and the part from the next driver's launch (the driver's own start and recovery).
- re-place: the namespace of the host holding the Space is deleted mid-session; from
  then to the Space's placement on another host (generation + 1: the driver's halt, the
  lost-host bound of the heartbeat, the placement), and to the next driver's first step
  (which rebuilds the workspace from the log first).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from durable_spaces.campaigns.cluster.lab import Cluster, wait_for
from durable_spaces.campaigns.cluster.netns import NetnsLab
from durable_spaces.campaigns.summary import percentile
from durable_spaces.cluster.pgserver import PgServer


def _first_backoff(backoff: str) -> float:
    return float(backoff.split(",")[0])


def resumes(c: Cluster, kills: int) -> tuple[list[float], list[float]]:
    """From each kill to the next driver's first step, and of that the part from the next
    driver's launch (its start, its store and host calls, its recovery)."""
    out, started = [], []
    for i in range(kills):
        name = f"kill{i}"
        c.submit(name, f"sp-{name}", name, calls=8)
        c.wait_first_step(name, 1)
        time.sleep(0.5)
        killed = c.kill_driver(name, 1)
        nxt = c.wait_first_step(name, 2)
        out.append(float(nxt.detail["unix_ms"]) - killed)
        launched = c.events("driver_launched", name)
        if len(launched) >= 2:
            started.append(float(nxt.detail["unix_ms"]) - launched[1].at.timestamp() * 1000)
        c.wait_session(name)
    return out, started


def replacements(c: Cluster, losses: int) -> tuple[list[float], list[float]]:
    placed, stepped = [], []
    for i in range(losses):
        name = f"lost{i}"
        c.submit(name, f"sp-{name}", name, calls=8)
        c.wait_first_step(name, 1)

        def has_result(n: str = name) -> bool:
            return len(c.history(n).results) >= 1

        wait_for("a result", has_result)
        holder = c.store.space(f"sp-{name}").host_id
        assert holder is not None
        t0 = time.time() * 1000
        c.lose(holder)

        def placements(n: str = name) -> list[Any]:
            return [e for e in c.events("space_placed") if e.space == f"sp-{n}"][1:]

        ev = wait_for("the new placement", placements)[0]
        placed.append(ev.at.timestamp() * 1000 - t0)

        def first_steps(n: str = name, after: Any = ev.at) -> list[Any]:
            return [e for e in c.events("driver_first_step", n) if e.at > after]

        steps = wait_for("the next first step", first_steps)
        stepped.append(float(steps[0].detail["unix_ms"]) - t0)
        c.wait_session(name)
        c.host(f"h{len(c.hosts) + 1}")  # keep two hosts up
    return placed, stepped


def show(what: str, ms: list[float]) -> None:
    if ms:
        print(
            f"{what}: n={len(ms)} p50={statistics.median(ms):.0f} ms "
            f"p95={percentile(ms, 95):.0f} ms max={max(ms):.0f} ms"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--losses", type=int, default=3)
    ap.add_argument("--backoff", default="2,60,2", help="the coordinator's initial,max,factor")
    ap.add_argument("--keep", type=Path, help="keep the lab's logs in this directory")
    args = ap.parse_args()
    with (
        PgServer() as pg,
        NetnsLab() as lab,
        tempfile.TemporaryDirectory(prefix="ds-bench-") as d,
    ):
        root = args.keep or Path(d)
        root.mkdir(parents=True, exist_ok=True)
        c = Cluster(pg.url(), root, lab)
        try:
            c.host("h1")
            c.host("h2")
            c.coordinator("c1", "--backoff", args.backoff)
            r, started = resumes(c, args.kills)
            show("resume after a driver kill", r)
            show("  without the backoff", [x - _first_backoff(args.backoff) * 1000 for x in r])
            show("  of it from the next driver's launch", started)
            placed, stepped = replacements(c, args.losses)
            show("lost host -> Space placed on another host", placed)
            show("lost host -> next driver's first step", stepped)
        finally:
            c.close()


if __name__ == "__main__":
    main()
