"""The coordinator: re-drives one durable session, one driver process per epoch.

Prior art: the reference's lab coordinator (cua-spaces-cluster sessions) and any job
supervisor with backoff. What it must guarantee, even when it is itself SIGKILLed:

- Exactly one driver per epoch. The next epoch is ``max(last issued, fenced floor seen) +
  1`` and is written to ``<state_dir>/coordinator.json`` (under an ``fcntl`` lock on
  ``coordinator.lock``, written to a temporary file, fsynced, renamed, directory fsynced)
  *before* the driver is spawned. A coordinator killed between the write and the spawn
  burns that epoch; its successor never issues it again.
- Restarting. A new coordinator on the same state dir resumes from the file. A driver
  recorded there that is still alive (same pid and process start time) while the
  coordinator that recorded it is dead is an orphan: by default it is SIGKILLed and waited
  for before the next epoch starts (``kill_orphans=True``), because nobody reads its
  output any more (it would die on its next write to the dead coordinator's pipe anyway);
  with ``kill_orphans=False`` it is left for the epoch fence to stop (exit 75), which is
  what a ``stale`` campaign wants. A driver of a coordinator that is still alive is never
  killed. A driver spawned but not yet recorded when its coordinator died is unknown to
  the successor and is always left to the fence.
- Exit codes: 0 done, 78 failed (permanent), 75 fenced: the process is ignored and the
  next epoch is launched without backoff, past any ``floor`` its ``{"event": "fenced",
  "floor": N}`` line named. Anything else (including -9) is a crash: resume after
  ``backoff`` (``initial * factor**k``, capped at ``max``, ``k`` = crashes so far minus
  one). After any exit but 0 and 78, if the file shows a newer epoch whose driver is
  alive and belongs to another coordinator (even one in this process), this one stops
  with ``superseded`` instead of fighting it.
- A driver whose stdout falls silent for ``stall_secs`` (heartbeats are output) is
  SIGKILLed and counts as a crash.
- ``abandon_current()`` gives up on the running driver *without* killing it: what a
  coordinator does when it believes a driver dead that is only paused (a GC pause, a
  frozen VM, a partition). The next epoch is launched as after a crash; the abandoned
  process is still reaped when it exits (its exit code lands on its ``Attempt``), and
  ``run()`` waits for abandoned drivers before it returns, so no stale driver is left
  running behind a finished session. Whoever paused it must continue it.
- ``place_space()`` raising ``PermanentFailure`` ends the session ``failed``; any other
  error is retried like a crash (backoff, counted against ``max_attempts``).

Order of one attempt: backoff, issue the epoch, ``before_launch`` hooks (they may edit
the environment, e.g. arm a failpoint, or inflict a Space fault), ``place_space()``, spawn,
record the pid. The driver's environment is the coordinator's without ``DS_FAILPOINTS`` /
``DS_FAILPOINT_TRACE`` (a hook or ``env`` sets them explicitly), plus ``CUA_SESSION_*``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import inspect
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from durable_spaces.chaos import failpoints
from durable_spaces.errors import PermanentFailure
from durable_spaces.session_protocol import (
    EXIT_DONE,
    EXIT_FENCED,
    EXIT_PERMANENT,
    driver_environment,
    read_line,
)

#: Not an exit code: what ``_supervise`` returns for a driver given up on (still alive).
EXIT_ABANDONED = -1000

STATE_FILE = "coordinator.json"
LOCK_FILE = "coordinator.lock"

#: Variables a driver never inherits from the coordinator (set them per attempt).
_SCRUBBED = ("DS_FAILPOINTS", "DS_FAILPOINT_TRACE")


def _now_ms() -> float:
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
    process: asyncio.subprocess.Process = field(repr=False)
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
    #: When the coordinator gave up on it without killing it (``abandon_current``).
    abandoned_ms: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    abandon: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    async def wait(self) -> int:
        await self.done.wait()
        assert self.exit_code is not None
        return self.exit_code


@dataclass(frozen=True)
class Resume:
    """From a driver's death to the next driver's ``first_step`` event.

    Drivers that died again before their first step are inside one resume;
    ``backoff_ms`` is every backoff slept in between, ``attempts`` the launches it took.
    """

    killed_ms: float
    first_step_ms: float
    backoff_ms: float
    cause: str  # "nemesis", "stall", "crash" (died by itself, e.g. a failpoint)
    attempts: int = 1

    @property
    def latency_ms(self) -> float:
        return self.first_step_ms - self.killed_ms

    @property
    def latency_excl_backoff_ms(self) -> float:
        return self.latency_ms - self.backoff_ms


@dataclass
class CoordinatorResult:
    """How the session ended: ``done``, ``failed`` (78), ``exhausted`` (attempt cap or
    timeout), ``superseded`` (another coordinator owns a newer epoch)."""

    status: str
    attempts: int
    epochs: list[int]
    exit_codes: list[int]
    events: list[dict[str, Any]]
    resumes: list[Resume]
    stalls: int = 0
    #: Drivers the coordinator itself SIGKILLed (stall, nemesis, timeout, exit).
    kills: int = 0
    reason: str = ""

    @property
    def resume_latencies_ms(self) -> list[float]:
        return [r.latency_ms for r in self.resumes]


# --- the state file ---------------------------------------------------------------------


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_state(state_dir: str | Path) -> dict[str, Any]:
    """The coordinator file (``{"last_epoch": 0}`` when there is none yet)."""
    p = Path(state_dir) / STATE_FILE
    try:
        data: dict[str, Any] = json.loads(p.read_text())
    except FileNotFoundError:
        return {"last_epoch": 0, "driver": None}
    return data


def _write_state(state_dir: Path, data: Mapping[str, Any]) -> None:
    tmp = state_dir / f".{STATE_FILE}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state_dir / STATE_FILE)
    dfd = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _process_alive(pid: int, create_time: float | None) -> bool:
    """Alive and the same process (a reused pid has another start time)."""
    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 0.05:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _my_ctime() -> float | None:
    try:
        return float(psutil.Process().create_time())
    except psutil.Error:
        return None


def _kill_and_reap(pid: int, create_time: float | None, timeout: float = 10.0) -> None:
    """SIGKILL a process that is not our child and wait until it is dead (a zombie left
    for a parent that does not reap counts as dead: it runs nothing)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + timeout
    while _process_alive(pid, create_time) and time.monotonic() < end:
        time.sleep(0.01)


# --- the coordinator --------------------------------------------------------------------


Hook = Callable[[Launch], Awaitable[None] | None]
EventCallback = Callable[[dict[str, Any]], None]


class Coordinator:
    """Re-drives ``argv`` (the driver entry) until it exits 0 or 78, or the cap.

    ``on_event`` receives every coordinator event as a dict with ``event`` in
    ``launch``, ``driver_event`` (a ``DS-EVENT`` line, under ``data``), ``exit``, ``stall``,
    ``kill``, ``backoff``, ``orphan_killed``, ``end``; each has ``epoch`` and ``unix_ms``.
    """

    def __init__(
        self,
        argv: Sequence[str],
        state_dir: str | Path,
        session_name: str,
        *,
        stall_secs: float = 120.0,
        heartbeat_secs: float | None = None,
        backoff: tuple[float, float, float] = (2.0, 60.0, 2.0),
        max_attempts: int = 20,
        place_space: Callable[[], Awaitable[None]] | None = None,
        on_event: EventCallback | None = None,
        before_launch: Sequence[Hook] = (),
        env: Mapping[str, str] | None = None,
        kill_orphans: bool = True,
        timeout_secs: float | None = None,
        cwd: str | Path | None = None,
        epoch_source: Callable[[int], Awaitable[int]] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.state_dir = Path(state_dir)
        self.session_name = session_name
        self.stall_secs = stall_secs
        self.heartbeat_secs = heartbeat_secs if heartbeat_secs is not None else stall_secs / 4
        self.backoff = backoff
        self.max_attempts = max_attempts
        self.place_space = place_space
        self.on_event = on_event
        self.before_launch = list(before_launch)
        self.extra_env = dict(env or {})
        self.kill_orphans = kill_orphans
        self.timeout_secs = timeout_secs
        self.cwd = cwd
        #: Where epochs come from when not from the state file: called with the highest
        #: fenced floor seen, it returns the next epoch, already durable (a cluster's
        #: database: ``max(previous + 1, lease token)``).
        self.epoch_source = epoch_source
        #: Tells this coordinator's drivers apart from another's (even in one process).
        self.id = uuid.uuid4().hex
        self.current: Attempt | None = None
        self.history: list[Attempt] = []
        self.events: list[dict[str, Any]] = []
        self._floor_seen = 0
        self._resumes: list[Resume] = []
        self._subscribers: list[asyncio.Queue[Attempt | None]] = []
        self._background: set[asyncio.Task[int]] = set()
        #: Set once the loop has decided how the session ends (before abandoned drivers
        #: are waited for): whoever keeps a driver paused must continue it now.
        self.settled = asyncio.Event()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "drivers").mkdir(exist_ok=True)

    # -- hooks for the runner ------------------------------------------------------------

    def kill_current(self, reason: str = "nemesis") -> int | None:
        """SIGKILL the running driver now; its pid, or None when none is running."""
        a = self.current
        if a is None or not a.alive or a.abandoned_ms is not None:
            return None  # an abandoned driver is its pauser's (and the fence's) business
        if a.killed_ms is None:
            a.killed_by, a.killed_ms = reason, _now_ms()
        try:
            os.kill(a.pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        self._emit("kill", a.epoch, pid=a.pid, reason=reason)
        return a.pid

    def abandon_current(self, reason: str = "paused") -> Attempt | None:
        """Stop waiting for the running driver without killing it (see the module doc);
        the attempt, or None when none is running."""
        a = self.current
        if a is None or not a.alive or a.abandoned_ms is not None:
            return None
        a.abandoned_ms = _now_ms()
        if a.killed_ms is None:
            a.killed_by, a.killed_ms = reason, a.abandoned_ms
        a.abandon.set()
        self._emit("abandon", a.epoch, pid=a.pid, reason=reason)
        return a

    def attempts(self) -> AsyncIterator[Attempt]:
        """Each attempt as it is launched, until the run ends (subscribe before ``run``)."""
        q: asyncio.Queue[Attempt | None] = asyncio.Queue()
        self._subscribers.append(q)

        async def gen() -> AsyncIterator[Attempt]:
            while (a := await q.get()) is not None:
                yield a

        return gen()

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> CoordinatorResult:
        """Drive to the end; kills the current driver if cancelled. Returns once every
        driver it launched has ended (abandoned ones included)."""
        try:
            if self.timeout_secs is None:
                result = await self._loop()
            else:
                try:
                    result = await asyncio.wait_for(self._loop(), self.timeout_secs)
                except TimeoutError:
                    await self._stop_current("timeout")
                    result = self._result("exhausted", f"timeout after {self.timeout_secs}s")
        finally:
            self.settled.set()
            await self._stop_current("coordinator_exit")
            await self._reap_abandoned()
            for q in self._subscribers:
                q.put_nowait(None)
        # Abandoned drivers may have ended after the loop did: their exits count too.
        result.exit_codes = [a.exit_code for a in self.history if a.exit_code is not None]
        result.events = list(self.events)
        return result

    async def _reap_abandoned(self, timeout: float = 120.0) -> None:
        """Wait for abandoned drivers to end (someone continues them); kill the ones that
        do not end in time, so none outlives the run."""
        left = [a for a in self.history if a.abandoned_ms is not None and a.alive]
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

    async def _stop_current(self, reason: str) -> None:
        """Kill and reap a driver left running by a timeout or a cancellation."""
        a = self.current
        if a is None or a.process.returncode is not None:
            return
        self.kill_current(reason)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(a.process.wait()), 10)
        if a.exit_code is None:
            a.exit_code = a.process.returncode
            a.ended_ms = _now_ms()
            a.done.set()

    async def _loop(self) -> CoordinatorResult:
        crashes = 0
        place_failures = 0
        backoff_ms = 0.0  # slept just before this launch
        down_backoff_ms = 0.0  # slept since the death not yet resumed from
        down_attempts = 0
        last_death: tuple[float, str] | None = None
        resumes = self._resumes

        async def back_off(epoch: int) -> float:
            initial, cap, factor = self.backoff
            delay = min(cap, initial * factor ** (crashes - 1))
            self._emit("backoff", epoch, delay_s=delay, crashes=crashes)
            await asyncio.sleep(delay)
            return delay * 1000

        while len(self.history) + place_failures < self.max_attempts:
            epoch = await self._next_epoch()
            launch = Launch(len(self.history), epoch, self._driver_env(epoch))
            for hook in self.before_launch:
                r = hook(launch)
                if inspect.isawaitable(r):
                    await r
            if self.place_space is not None:
                try:
                    await self.place_space()
                except PermanentFailure as e:
                    return self._result("failed", f"place_space: {e}")
                except Exception as e:
                    # The Space could not be placed now (its host is down, say): like a
                    # crash, retried after a backoff, and counted against the cap.
                    place_failures += 1
                    crashes += 1
                    self._emit("place_failed", epoch, error=f"{type(e).__name__}: {e}")
                    if len(self.history) + place_failures >= self.max_attempts:
                        break
                    backoff_ms = await back_off(epoch)
                    down_backoff_ms += backoff_ms
                    continue
            attempt = await self._spawn(launch, backoff_ms)
            down_attempts += 1
            code = await self._supervise(attempt)
            if last_death is not None and attempt.first_step_ms is not None:
                resumes.append(
                    Resume(
                        last_death[0],
                        attempt.first_step_ms,
                        down_backoff_ms,
                        last_death[1],
                        down_attempts,
                    )
                )
                last_death = None
            if code == EXIT_DONE:
                return self._result("done")
            if code == EXIT_PERMANENT:
                return self._result("failed", "driver exited 78 (permanent failure)")
            backoff_ms = 0.0
            if self._superseded(attempt.epoch):
                return self._result("superseded", "a newer epoch's driver is running")
            if code == EXIT_FENCED:
                continue
            crashes += 1
            if last_death is None:
                cause = attempt.killed_by or "crash"
                last_death = (attempt.killed_ms or attempt.ended_ms or _now_ms(), cause)
                down_backoff_ms, down_attempts = 0.0, 0
            if len(self.history) + place_failures >= self.max_attempts:
                break
            backoff_ms = await back_off(attempt.epoch)
            down_backoff_ms += backoff_ms
        return self._result(
            "exhausted",
            f"attempt cap {self.max_attempts} reached ({place_failures} placements failed)",
        )

    # -- pieces --------------------------------------------------------------------------

    async def _next_epoch(self) -> int:
        if self.epoch_source is not None:
            epoch = await self.epoch_source(self._floor_seen)
            failpoints.hit("coordinator.epoch_issued")
            return epoch
        return self._issue_epoch()

    def _issue_epoch(self) -> int:
        """Persist the next epoch before anything runs under it (see the module doc)."""
        with _locked(self.state_dir):
            st = read_state(self.state_dir)
            drv = st.get("driver")
            if (
                self.kill_orphans
                and drv
                and not self._ours(drv)
                and not _process_alive(int(drv["coordinator_pid"]), drv.get("coordinator_ctime"))
                and _process_alive(int(drv["pid"]), drv.get("create_time"))
            ):
                _kill_and_reap(int(drv["pid"]), drv.get("create_time"))
                self._emit("orphan_killed", int(drv["epoch"]), pid=int(drv["pid"]))
            epoch = max(int(st.get("last_epoch", 0)), self._floor_seen) + 1
            _write_state(
                self.state_dir,
                {"session": self.session_name, "last_epoch": epoch, "driver": None},
            )
        failpoints.hit("coordinator.epoch_issued")
        return epoch

    def _record_driver(self, a: Attempt) -> None:
        try:
            ctime: float | None = psutil.Process(a.pid).create_time()
        except psutil.Error:
            ctime = None
        with _locked(self.state_dir):
            st = read_state(self.state_dir)
            if int(st.get("last_epoch", 0)) != a.epoch:
                return  # another coordinator issued a newer epoch meanwhile
            st["driver"] = {
                "epoch": a.epoch,
                "pid": a.pid,
                "create_time": ctime,
                "coordinator_pid": os.getpid(),
                "coordinator_ctime": _my_ctime(),
                "coordinator_id": self.id,
            }
            _write_state(self.state_dir, st)
        failpoints.hit("coordinator.driver_recorded")

    def _superseded(self, epoch: int) -> bool:
        st = read_state(self.state_dir)
        drv = st.get("driver")
        return bool(
            int(st.get("last_epoch", 0)) > epoch
            and drv
            and not self._ours(drv)
            and _process_alive(int(drv["pid"]), drv.get("create_time"))
        )

    def _ours(self, drv: Mapping[str, Any]) -> bool:
        return drv.get("coordinator_id") == self.id

    def _driver_env(self, epoch: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
        env.update(self.extra_env)
        env.update(
            driver_environment(self.session_name, epoch, self.state_dir, self.heartbeat_secs)
        )
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def _spawn(self, launch: Launch, backoff_ms: float) -> Attempt:
        log_path = self.state_dir / "drivers" / f"epoch-{launch.epoch}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
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
        a = Attempt(
            index=launch.index,
            epoch=launch.epoch,
            pid=proc.pid,
            started_ms=_now_ms(),
            process=proc,
            log_path=log_path,
            backoff_ms=backoff_ms,
        )
        self.current = a
        self.history.append(a)
        self._record_driver(a)
        self._emit("launch", a.epoch, pid=a.pid, index=a.index)
        for q in self._subscribers:
            q.put_nowait(a)
        return a

    async def _supervise(self, a: Attempt) -> int:
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
                    self._line(a, raw.decode(errors="replace").rstrip("\n"))

        reader = asyncio.create_task(read())
        waiter = asyncio.create_task(a.process.wait())
        abandoned = asyncio.create_task(a.abandon.wait())
        tick = min(1.0, self.stall_secs / 8)
        try:
            while not waiter.done() and not abandoned.done():
                await asyncio.wait({waiter, abandoned}, timeout=tick)
                silent = time.monotonic() - last_output
                if (
                    not waiter.done()
                    and not abandoned.done()
                    and a.killed_ms is None
                    and silent > self.stall_secs
                ):
                    self._emit("stall", a.epoch, pid=a.pid, silent_s=self.stall_secs)
                    self.kill_current("stall")
            if not waiter.done():
                # Given up on, not dead: reap it whenever it ends, and go on now.
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
        a.ended_ms = _now_ms()
        a.done.set()
        self._emit(
            "exit",
            a.epoch,
            pid=a.pid,
            code=code,
            killed_by=a.killed_by,
            abandoned=a.abandoned_ms is not None,
        )
        return code

    def _line(self, a: Attempt, line: str) -> None:
        for kind, data in read_line(line):
            if kind == "heartbeat":
                a.heartbeats += 1
            elif data is not None:
                self._driver_event(a, dict(data))

    def _driver_event(self, a: Attempt, data: dict[str, Any]) -> None:
        a.events.append(data)
        if data.get("event") == "first_step" and a.first_step_ms is None:
            a.first_step_ms = float(data.get("unix_ms") or _now_ms())
        if data.get("event") == "fenced":
            floor = data.get("floor")
            if isinstance(floor, int):
                self._floor_seen = max(self._floor_seen, floor)
        self._emit("driver_event", a.epoch, data=data)

    def _emit(self, event: str, epoch: int, **fields: Any) -> None:
        ev = {"event": event, "epoch": epoch, "unix_ms": _now_ms(), **fields}
        self.events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def _result(self, status: str, reason: str = "") -> CoordinatorResult:
        self._emit("end", self.history[-1].epoch if self.history else 0, status=status)
        return CoordinatorResult(
            status=status,
            attempts=len(self.history),
            epochs=[a.epoch for a in self.history],
            exit_codes=[a.exit_code for a in self.history if a.exit_code is not None],
            events=list(self.events),
            resumes=list(getattr(self, "_resumes", [])),
            stalls=sum(1 for a in self.history if a.killed_by == "stall"),
            kills=sum(1 for a in self.history if a.killed_by is not None),
            reason=reason,
        )
