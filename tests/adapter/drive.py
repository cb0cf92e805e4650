"""A minimal sequential re-driver for adapter crash tests: one real driver process per
attempt, each with its epoch and failpoints, until it exits 0 (or the attempt cap).

The full coordinator (backoff, heartbeats, stall) lives in durable_spaces.campaigns; these
tests want each attempt's schedule spelled out by hand instead.

A command that must outlive a driver's restart holds on a gate (``setup(gate=True)``:
every appending command of the workload waits for the file ``gate_of(tmp)``), opened by
the test when the driver's own failpoint trace shows the point it waits for
(``Attempt.release``, ``gate_opened_at``): no sleep has to outlast a loaded machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from durable_spaces.backends import open_backend
from durable_spaces.campaigns.agent import AgentConfigFile
from durable_spaces.campaigns.checker import Workload, check_all, collect

SESSION = "crash-session"
#: How long a wait for a driver's event may take before it is a hang: never a pace the
#: test relies on (the event ends the wait), only a test that fails instead of hanging.
HANG_S = 300.0


@dataclass
class Attempt:
    failpoint: str = ""  # DS_FAILPOINTS for this attempt ("" = none)
    epoch: int | None = None  # None: previous + 1
    before: Callable[[Path], Awaitable[None]] | None = None  # a fault before launching
    #: A fault while the driver runs, given the failpoint trace file to wait on.
    during: Callable[[Path, Path], Awaitable[None]] | None = None
    #: ``"point n"``: open the gate (``setup(gate=True)``) once this attempt's failpoint
    #: trace shows the n-th hit of ``point`` (at the attempt's end at the latest).
    release: str = ""


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
    gate: bool = False,
) -> Path:
    """The session's ``agent.json`` in ``tmp``; ``gate``: its commands hold until the
    file ``gate_of(tmp)`` exists (``sleep`` is then 0 unless given)."""
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
        gate=str(gate_of(tmp)) if gate else None,
    ).save(tmp / "state")
    return tmp


def gate_of(tmp: Path) -> Path:
    """The file the commands of ``tmp``'s session wait for (``setup(gate=True)``)."""
    return tmp / "gate"


def trace_shows(trace: Path, point: str) -> bool:
    """Whether the failpoint trace ``trace`` has a whole line for ``point`` (``"name n"``:
    the n-th hit of name; lines are ``name n g ...``)."""
    try:
        text = trace.read_text()
    except FileNotFoundError:
        return False
    whole = text[: text.rfind("\n") + 1]  # a line being written is not read half
    return point in {" ".join(line.split()[:2]) for line in whole.splitlines()}


def wait_for_point(trace: Path, point: str, driver: subprocess.Popen[str]) -> None:
    """Return once ``driver`` wrote ``point`` to its trace ``trace``; fail when it exits
    before (or hangs for ``HANG_S``)."""
    deadline = time.monotonic() + HANG_S
    while not trace_shows(trace, point):
        if driver.poll() is not None and not trace_shows(trace, point):
            raise AssertionError(f"the driver exited {driver.returncode} before {point}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the driver never reached {point}")
        time.sleep(0.01)


@contextmanager
def gate_opened_at(tmp: Path, trace: Path, point: str) -> Iterator[None]:
    """While inside: a thread opens ``tmp``'s gate once ``trace`` shows ``point``. On
    leaving (the driver ended) it is opened if it was not: a later driver's commands
    must not hold on it for good, the test's assertions say what went wrong."""
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if trace_shows(trace, point):
                gate_of(tmp).touch()
                return
            done.wait(0.01)

    thread = threading.Thread(target=watch, name="open-gate", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        gate_of(tmp).touch()


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
        trace = tmp / f"trace-{len(out.codes)}-{epoch}"
        if a.during is not None or a.release:
            env["DS_FAILPOINT_TRACE"] = str(trace)
        gate = gate_opened_at(tmp, trace, a.release) if a.release else nullcontext()
        with gate:
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
            try:
                stdout, stderr = p.communicate(timeout=HANG_S)
            except subprocess.TimeoutExpired:
                p.kill()  # a hung driver fails the test, and is not left behind
                p.communicate()
                raise
            if fault is not None:
                fault.join(timeout=HANG_S)
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
    workload = Workload(
        seed=cfg.seed, calls=cfg.calls, sleep=cfg.sleep, server=cfg.server, gate=cfg.gate
    )
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
