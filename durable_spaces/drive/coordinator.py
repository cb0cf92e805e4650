"""The coordinator: re-drives one durable session, one driver process per epoch.

Here is the re-drive loop (``Coordinator``); the durable state file and epoch issuance
are ``drive/coordinator_state.py``, one driver's launch, supervision and reaping
``drive/supervisor.py``. What they export is importable from here too.

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
import inspect
import os
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_spaces.chaos import failpoints, points
from durable_spaces.drive.coordinator_state import LOCK_FILE, STATE_FILE, StateFile, read_state
from durable_spaces.drive.protocol import (
    EXIT_DONE,
    EXIT_FENCED,
    EXIT_PERMANENT,
    driver_environment,
)
from durable_spaces.drive.supervisor import EXIT_ABANDONED, Attempt, Launch, Supervisor, now_ms
from durable_spaces.errors import PermanentFailure
from durable_spaces.settings import Settings

#: Variables a driver never inherits from the coordinator (set them per attempt).
_SCRUBBED = ("DS_FAILPOINTS", "DS_FAILPOINT_TRACE")


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
        warm: bool | None = None,
        settings: Settings | None = None,
    ) -> None:
        # The product's settings (durable_spaces/settings.py), read now when not given:
        # whether to keep a warm driver (``warm`` None), the campaign zygote's socket.
        settings = Settings.from_env() if settings is None else settings
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
        #: Set once the loop has decided how the session ends (before abandoned drivers
        #: are waited for): whoever keeps a driver paused must continue it now.
        self.settled = asyncio.Event()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "drivers").mkdir(exist_ok=True)
        self._state = StateFile(self.state_dir, session_name, self.id)
        self._drivers = Supervisor(
            self.argv,
            self.state_dir / "drivers",
            cwd=cwd,
            stall_secs=stall_secs,
            emit=self._emit,
            kill=self.kill_current,
            on_event=self._driver_event,
            # A spare driver per coordinator (drive/spares.py): on unless turned off.
            warm=settings.warm_drivers if warm is None else warm,
            zygote=str(settings.zygote_socket) if settings.zygote_socket else None,
        )

    # -- hooks for the runner ------------------------------------------------------------

    def kill_current(self, reason: str = "nemesis") -> int | None:
        """SIGKILL the running driver now; its pid, or None when none is running."""
        a = self.current
        if a is None or not a.alive or a.abandoned_ms is not None:
            return None  # an abandoned driver is its pauser's (and the fence's) business
        if a.killed_ms is None:
            a.killed_by, a.killed_ms = reason, now_ms()
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
        a.abandoned_ms = now_ms()
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
                    await self._drivers.stop(self.current, "timeout")
                    result = self._result("exhausted", f"timeout after {self.timeout_secs}s")
        finally:
            self.settled.set()
            await self._drivers.close_spares()
            await self._drivers.stop(self.current, "coordinator_exit")
            await self._drivers.reap_abandoned(self.history)
            for q in self._subscribers:
                q.put_nowait(None)
        # Abandoned drivers may have ended after the loop did: their exits count too.
        result.exit_codes = [a.exit_code for a in self.history if a.exit_code is not None]
        result.events = list(self.events)
        return result

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
            code = await self._drivers.supervise(attempt)
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
            if self._state.superseded(attempt.epoch):
                return self._result("superseded", "a newer epoch's driver is running")
            if code == EXIT_FENCED:
                continue
            crashes += 1
            if last_death is None:
                cause = attempt.killed_by or "crash"
                last_death = (attempt.killed_ms or attempt.ended_ms or now_ms(), cause)
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
            failpoints.hit(points.COORDINATOR_EPOCH_ISSUED)
            return epoch
        return self._issue_epoch()

    def _issue_epoch(self) -> int:
        """The next epoch from the state file (``bench/coordinator.py`` times this)."""

        def orphan(epoch: int, pid: int) -> None:
            self._emit("orphan_killed", epoch, pid=pid)

        return self._state.issue(self._floor_seen, self.kill_orphans, orphan)

    def _driver_env(self, epoch: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
        env.update(self.extra_env)
        env.update(
            driver_environment(self.session_name, epoch, self.state_dir, self.heartbeat_secs)
        )
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def _spawn(self, launch: Launch, backoff_ms: float) -> Attempt:
        a = await self._drivers.spawn(launch, backoff_ms)
        self.current = a
        self.history.append(a)
        self._state.record_driver(a.epoch, a.pid)
        self._emit("launch", a.epoch, pid=a.pid, index=a.index, warm=a.warm)
        for q in self._subscribers:
            q.put_nowait(a)
        return a

    def _driver_event(self, a: Attempt, data: dict[str, Any]) -> None:
        if data.get("event") == "fenced":
            floor = data.get("floor")
            if isinstance(floor, int):
                self._floor_seen = max(self._floor_seen, floor)
        self._emit("driver_event", a.epoch, data=data)

    def _emit(self, event: str, epoch: int, **fields: Any) -> None:
        ev = {"event": event, "epoch": epoch, "unix_ms": now_ms(), **fields}
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
            resumes=list(self._resumes),
            stalls=sum(1 for a in self.history if a.killed_by == "stall"),
            kills=sum(1 for a in self.history if a.killed_by is not None),
            reason=reason,
        )


__all__ = [
    "EXIT_ABANDONED",
    "LOCK_FILE",
    "STATE_FILE",
    "Attempt",
    "Coordinator",
    "CoordinatorResult",
    "EventCallback",
    "Hook",
    "Launch",
    "Resume",
    "read_state",
]
