"""A minimal sequential re-driver for adapter crash tests: one real driver process per
attempt, each with its epoch and failpoints, until it exits 0 (or the attempt cap).

The full coordinator (backoff, heartbeats, stall) lives in durable_spaces.campaigns; these
tests want each attempt's schedule spelled out by hand instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from durable_spaces.backends import open_backend
from durable_spaces.campaigns.agent import AgentConfigFile
from durable_spaces.campaigns.checker import Workload, check_all, collect

SESSION = "crash-session"


@dataclass
class Attempt:
    failpoint: str = ""  # DS_FAILPOINTS for this attempt ("" = none)
    epoch: int | None = None  # None: previous + 1
    before: Callable[[Path], Awaitable[None]] | None = None  # a fault before launching
    #: A fault while the driver runs, given the failpoint trace file to wait on.
    during: Callable[[Path, Path], Awaitable[None]] | None = None


@dataclass
class Outcome:
    codes: list[int] = field(default_factory=list)
    events: list[dict[str, object]] = field(default_factory=list)
    verdicts: dict[str, dict[str, object]] = field(default_factory=dict)
    stderr: list[str] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return [str(e["kind"]) for e in self.events if e.get("event") == "recovery"]

    @property
    def valid(self) -> bool:
        return all(v.get("valid") is True for v in self.verdicts.values())


def setup(
    tmp: Path,
    backend: str,
    mode: str,
    *,
    calls: int = 6,
    seed: str = "7",
    store: bool = True,
    sleep: float = 0.3,
    max_files: int | None = None,
    snapshots: str = "workspace",
) -> Path:
    AgentConfigFile(
        backend=backend,
        backend_dir=str(tmp / "spaces"),
        mode=mode,
        seed=seed,
        calls=calls,
        store_dir=str(tmp / "store") if store else None,
        sleep=sleep,
        max_files=max_files,
        snapshots=snapshots,
    ).save(tmp / "state")
    return tmp


AGENT = [sys.executable, "-m", "durable_spaces.campaigns.agent"]


def driver_env(
    tmp: Path, epoch: int, *, failpoints: str = "", heartbeat: int = 5
) -> dict[str, str]:
    """The environment a coordinator gives a driver of ``tmp``'s session at ``epoch``."""
    env = dict(os.environ)
    env.update(
        CUA_SESSION_NAME=SESSION,
        CUA_SESSION_EPOCH=str(epoch),
        CUA_SESSION_STATE_DIR=str(tmp / "state"),
        CUA_SESSION_HEARTBEAT_SECS=str(heartbeat),
        DS_FAILPOINTS=failpoints,
    )
    return env


def drive(
    tmp: Path, attempts: list[Attempt], *, max_attempts: int = 12, backend: str = "local"
) -> Outcome:
    out = Outcome()
    epoch = 0
    plan = list(attempts)
    for _ in range(max_attempts):
        a = plan.pop(0) if plan else Attempt()
        epoch = a.epoch if a.epoch is not None else epoch + 1
        if a.before is not None:
            asyncio.run(a.before(tmp))
        env = driver_env(tmp, epoch, failpoints=a.failpoint)
        trace = tmp / f"trace-{epoch}"
        if a.during is not None:
            env["DS_FAILPOINT_TRACE"] = str(trace)
        p = subprocess.Popen(
            AGENT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        fault = None
        if a.during is not None:
            fault = threading.Thread(target=asyncio.run, args=(a.during(tmp, trace),))
            fault.start()
        stdout, stderr = p.communicate(timeout=120)
        if fault is not None:
            fault.join(timeout=120)
        out.codes.append(p.returncode)
        out.stderr.append(stderr[-2000:])
        for line in stdout.splitlines():
            if line.startswith("DS-EVENT "):
                out.events.append(json.loads(line[len("DS-EVENT ") :]))
        if p.returncode in (0, 78):
            break
    try:
        out.verdicts = asyncio.run(check(tmp, backend))
    finally:
        asyncio.run(cleanup(tmp, backend))
    return out


async def cleanup(tmp: Path, backend: str) -> None:
    """Delete the run's Spaces: daemons and detached commands must not outlive a test."""
    b = open_backend(backend, tmp / "spaces")
    try:
        for name in await b.names():
            await b.delete(name)
    finally:
        await b.close()


async def check(tmp: Path, backend: str) -> dict[str, dict[str, object]]:
    """Every campaign check on the session in ``tmp`` (no launch history: these tests
    choose epochs by hand, a same-epoch restart included)."""
    cfg = AgentConfigFile.load(tmp / "state")
    workload = Workload(seed=cfg.seed, calls=cfg.calls, sleep=cfg.sleep, server=cfg.server)
    b = open_backend(backend, tmp / "spaces")
    try:
        names = await b.names()
        assert len(names) == 1, names
        space = await b.find(names[0])
        assert space is not None
        inputs = await collect(space, tmp / "state" / "log.sqlite", workload=workload)
        return check_all(inputs)
    finally:
        await b.close()
