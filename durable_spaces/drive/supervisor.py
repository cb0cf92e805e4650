"""One driver process of a coordinated session (``drive/coordinator.py``): its launch,
its attempt, its supervision.

A ``Supervisor`` spawns the driver (its own session, stdout piped, stderr to
``drivers/epoch-<n>.log``), reads its output line by line (every line counts as a sign
of life; heartbeats and ``DS-EVENT`` lines are parsed by ``drive.protocol``), kills it
when it has been silent for ``stall_secs``, and reaps it. A driver given up on without
being killed (``Attempt.abandon``) is left running: its reaping continues in the
background and its exit code lands on its ``Attempt`` whenever it ends; when the
session ends, abandoned drivers are waited for (``reap_abandoned``) and none outlives it.

With ``warm`` on, an attempt takes the coordinator's spare (``drive/spares.py``: a
driver process started before its epoch, imports done) instead of a new interpreter
when it can; either way the attempt is one process with the same pid, process group,
pipes and exit codes, supervised the same. The next attempt's spare is started once the
attempt's driver has spoken (its first line: a driver prints its first heartbeat when
its imports are done), or when it ends or is abandoned before that: started at the
launch, the spare's interpreter and imports took the CPU from a cold driver's own, on
the path every run waits on (a run's first driver is cold, as in its exact replays). A
warm driver speaks as soon as it is launched, so its successor's spare starts at once,
as before. The rule follows the attempt's own output, so a run and its exact replays
(``campaigns/replay.py``) start their spares alike.

With the campaign's zygote (``drive/zygote.py``, named by ``DS_ZYGOTE_SOCKET``) a
spare is a fork of a process that has done the imports: it takes no interpreter start
from anyone, so the first attempt takes one too. The runner keeps its zygote for the
exact replays and shrinks of its runs, and ``repro`` starts one, so those start their
drivers alike as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_spaces.chaos import failpoints
from durable_spaces.drive.protocol import EXIT_DONE, EXIT_PERMANENT, read_line
from durable_spaces.drive.spares import Spares
from durable_spaces.drive.zygote import DriverProcess

#: Not an exit code: what ``Supervisor.supervise`` returns for a driver given up on
#: (still alive).
EXIT_ABANDONED = -1000

Emit = Callable[..., None]


def now_ms() -> float:
    return time.time() * 1000


@dataclass
class Launch:
    """Given to ``before_launch`` hooks: edit ``env`` to change this attempt's driver."""

    index: int
    epoch: int
    env: dict[str, str]


@dataclass
class Attempt:
    """One driver process (one epoch)."""

    index: int
    epoch: int
    pid: int
    started_ms: float
    process: DriverProcess = field(repr=False)
    exit_code: int | None = None
    ended_ms: float | None = None
    #: Why the coordinator killed it ("stall", "nemesis", ...), None if it died alone.
    killed_by: str | None = None
    killed_ms: float | None = None
    first_step_ms: float | None = None
    heartbeats: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    log_path: Path | None = None
    backoff_ms: float = 0.0
    #: Launched from the coordinator's spare (a warm driver), not a new interpreter.
    warm: bool = False
    #: When the coordinator gave up on it without killing it (``abandon_current``).
    abandoned_ms: float | None = None
    #: The launch's environment, until the next attempt's spare is started from it.
    spare_env: dict[str, str] | None = field(default=None, repr=False)
    #: Its failpoint trace (``DS_FAILPOINT_TRACE``), where the lab reads the last point
    #: it passed (``inject.last_hit``); None when it writes none.
    trace: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    abandon: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    async def wait(self) -> int:
        await self.done.wait()
        assert self.exit_code is not None
        return self.exit_code


class Supervisor:
    """Spawns and watches one coordinator's drivers, one at a time.

    ``emit(event, epoch, **fields)`` records a coordinator event; ``kill(reason)`` kills
    the current driver (the coordinator's ``kill_current``); ``on_event(attempt, data)``
    receives each driver event after the attempt has taken what it needs from it."""

    def __init__(
        self,
        argv: Sequence[str],
        drivers_dir: Path,
        *,
        cwd: str | Path | None,
        stall_secs: float,
        emit: Emit,
        kill: Callable[[str], int | None],
        on_event: Callable[[Attempt, dict[str, Any]], None],
        warm: bool = False,
        zygote: str | None = None,
    ) -> None:
        """``warm``: a spare driver (``drive/spares.py``), forked by the campaign's
        ``zygote`` (its socket) when one is given."""
        self.argv = list(argv)
        self.drivers_dir = drivers_dir
        self.cwd = cwd
        self.stall_secs = stall_secs
        self._emit = emit
        self._kill = kill
        self._on_event = on_event
        self._background: set[asyncio.Task[int]] = set()
        self.spares: Spares | None = (
            Spares(self.argv, drivers_dir.parent, cwd=cwd, emit=emit, zygote=zygote)
            if warm
            else None
        )

    async def spawn(self, launch: Launch, backoff_ms: float) -> Attempt:
        log_path = self.drivers_dir / f"epoch-{launch.epoch}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            proc: DriverProcess | None = None
            if self.spares is not None:
                if self.spares.forks:  # a fork takes no CPU from anyone: the first too
                    self.spares.refill(launch.env)
                proc = await self.spares.take(launch.epoch, launch.env, log)
            warm = proc is not None
            if proc is None:
                proc = await asyncio.create_subprocess_exec(
                    *self.argv,
                    env=launch.env,
                    cwd=self.cwd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                    limit=1 << 20,
                )
        finally:
            log.close()
        return Attempt(
            index=launch.index,
            epoch=launch.epoch,
            pid=proc.pid,
            started_ms=now_ms(),
            process=proc,
            log_path=log_path,
            backoff_ms=backoff_ms,
            warm=warm,
            spare_env=launch.env if self.spares is not None else None,
            trace=failpoints.trace_of(launch.env),
        )

    def _refill(self, a: Attempt) -> None:
        """Start the next attempt's spare (once per attempt; see the module doc)."""
        env, a.spare_env = a.spare_env, None
        if env is not None and self.spares is not None:
            self.spares.refill(env)

    async def close_spares(self) -> None:
        """Kill and reap the spare: none outlives the session."""
        if self.spares is not None:
            await self.spares.close()

    async def supervise(self, a: Attempt) -> int:
        """Until the driver exits (its code) or is abandoned (``EXIT_ABANDONED``)."""
        last_output = time.monotonic()

        async def read() -> None:
            nonlocal last_output
            assert a.process.stdout is not None
            with open(a.log_path or os.devnull, "ab") as log:
                while True:
                    try:
                        raw = await a.process.stdout.readline()
                    except ValueError:  # a line over the limit: take what is there
                        raw = await a.process.stdout.read(1 << 20)
                    if not raw:
                        return
                    last_output = time.monotonic()
                    log.write(raw)
                    log.flush()
                    self.line(a, raw.decode(errors="replace").rstrip("\n"))

        reader = asyncio.create_task(read())
        waiter = asyncio.create_task(a.process.wait())
        abandoned = asyncio.create_task(a.abandon.wait())
        tick = min(1.0, self.stall_secs / 8)
        try:
            while not waiter.done() and not abandoned.done():
                # FIRST_COMPLETED: the default (all) would notice a death only at the
                # next tick, adding up to a second to every resume.
                await asyncio.wait(
                    {waiter, abandoned}, timeout=tick, return_when=asyncio.FIRST_COMPLETED
                )
                silent = time.monotonic() - last_output
                if (
                    not waiter.done()
                    and not abandoned.done()
                    and a.killed_ms is None
                    and silent > self.stall_secs
                ):
                    self._emit("stall", a.epoch, pid=a.pid, silent_s=self.stall_secs)
                    self._kill("stall")
            if not waiter.done():
                # Given up on, not dead: reap it whenever it ends, and go on now.
                self._refill(a)
                t = asyncio.create_task(self._finish(a, reader, waiter))
                self._background.add(t)
                t.add_done_callback(self._background.discard)
                return EXIT_ABANDONED
        except BaseException:
            for task in (reader, waiter):
                task.cancel()
            raise
        finally:
            abandoned.cancel()
        return await self._finish(a, reader, waiter)

    async def _finish(
        self, a: Attempt, reader: asyncio.Task[None], waiter: asyncio.Task[int]
    ) -> int:
        code = await waiter
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(reader, 2.0)  # a grandchild may hold the pipe
        if not reader.done():
            reader.cancel()
        a.exit_code = code
        a.ended_ms = now_ms()
        a.done.set()
        silent = a.killed_by == "stall" and not a.heartbeats and not a.events
        if a.warm and silent and self.spares is not None:  # from its launch on: no more
            self.spares.give_up(f"the warm driver of epoch {a.epoch} never spoke")
        if code not in (EXIT_DONE, EXIT_PERMANENT):  # it ended before it spoke
            self._refill(a)  # (after a give_up: refused)
        self._emit(
            "exit",
            a.epoch,
            pid=a.pid,
            code=code,
            killed_by=a.killed_by,
            abandoned=a.abandoned_ms is not None,
        )
        return code

    async def stop(self, a: Attempt | None, reason: str) -> None:
        """Kill and reap the driver ``a`` left running by a timeout or a cancellation (it
        is the coordinator's current one: ``kill`` kills that)."""
        if a is None or a.process.returncode is not None:
            return
        self._kill(reason)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(a.process.wait()), 10)
        if a.exit_code is None:
            a.exit_code = a.process.returncode
            a.ended_ms = now_ms()
            a.done.set()

    async def reap_abandoned(self, attempts: Sequence[Attempt], timeout: float = 120.0) -> None:
        """Wait for abandoned drivers to end (someone continues them); kill the ones that
        do not end in time, so none outlives the run."""
        left = [a for a in attempts if a.abandoned_ms is not None and a.alive]
        if not left:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(a.done.wait() for a in left)), timeout)
        for a in left:
            if a.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(a.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(a.done.wait(), 10)

    def line(self, a: Attempt, line: str) -> None:
        """One line of ``a``'s output: heartbeats counted, events taken (several may be
        glued on one line when writes interleave)."""
        self._refill(a)  # it speaks: its imports are done (see the module doc)
        for kind, data in read_line(line):
            if kind == "heartbeat":
                a.heartbeats += 1
            elif data is not None:
                event = dict(data)
                a.events.append(event)
                if event.get("event") == "first_step" and a.first_step_ms is None:
                    a.first_step_ms = float(event.get("unix_ms") or now_ms())
                self._on_event(a, event)
