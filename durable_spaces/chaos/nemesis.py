"""The nemesis: the parts that inflict faults, as small objects over one protocol.

Jepsen's shape: an operation is a plain record (``Op``); a nemesis takes an ``invoke``
op and returns its completion (``ok``, ``fail``, or ``info`` when the outcome is
unknown). Nemeses compose by the op kinds they claim, and two claiming one kind is an
error, so a campaign states exactly who does what. Every completed op is kept with its
times in the composed nemesis's ``history``, which is what a run record counts.

Kinds: ``kill`` (SIGKILL the current driver), ``pause`` (SIGSTOP it, maybe let a newer
driver take over, SIGCONT it later), ``daemon_kill``, ``space_restart``, ``space_remove``
and ``space_pause`` (through a ``SpaceBackend``), ``power_loss`` (through a ``LosesPower``),
``log_loss`` (through a ``LogStorage``),
``disk_stall`` (through a ``StallableDisk``: the driver stuck inside a durability call,
maybe taken over meanwhile, as a pause is), ``journal_kill`` (a command in the Space,
``journal_kill.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from durable_spaces.space import SpaceBackend


@dataclass(frozen=True)
class Op:
    """One nemesis operation. ``type``: invoke, ok, fail, or info (outcome unknown)."""

    kind: str
    type: str = "invoke"
    value: Any = None
    time_ms: float = field(default_factory=lambda: time.time() * 1000)
    end_ms: float | None = None
    error: str | None = None
    #: What the fault found where it landed, small enough for the run's record (the
    #: injector keeps it with the fault's place: ``journal_kill``'s helpers killed).
    found: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "type": self.type,
            "value": self.value,
            "time_ms": self.time_ms,
            "end_ms": self.end_ms,
            "error": self.error,
            "found": None if self.found is None else dict(self.found),
        }


def _done(
    op: Op,
    type_: str,
    value: Any = None,
    error: str | None = None,
    found: Mapping[str, Any] | None = None,
) -> Op:
    return replace(
        op,
        type=type_,
        value=op.value if value is None else value,
        end_ms=time.time() * 1000,
        error=error,
        found=found,
    )


class Nemesis(Protocol):
    """Inflicts the op kinds it claims."""

    kinds: frozenset[str]

    async def invoke(self, op: Op) -> Op: ...


class Killable(Protocol):
    """Something with a current driver to SIGKILL (the coordinator)."""

    def kill_current(self, reason: str = ...) -> int | None: ...


class DriverKiller:
    """``kill``: SIGKILL the current driver. ``ok`` with the pid, ``fail`` if none ran."""

    kinds = frozenset({"kill"})

    def __init__(self, target: Killable | Callable[[], int | None]) -> None:
        self._target = target

    async def invoke(self, op: Op) -> Op:
        if hasattr(self._target, "kill_current"):
            pid = self._target.kill_current("nemesis")
        else:
            pid = self._target()
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pid = None
        if pid is None:
            return _done(op, "fail", error="no driver running")
        return _done(op, "ok", value=pid)


class Pausable(Protocol):
    """A coordinator whose current driver can be paused and given up on (see
    ``Coordinator.abandon_current``)."""

    history: Any
    settled: asyncio.Event

    @property
    def current(self) -> Any: ...

    def abandon_current(self, reason: str = ...) -> Any: ...


def is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


#: The longest a paused driver waits for its successor's first step before it is
#: continued anyway (the successor may be waiting for something the paused one holds).
TAKEOVER_WAIT_S = 15.0


class DriverPauser:
    """``pause``: SIGSTOP the driver of ``value["epoch"]`` (or find it stopped already, at
    its pause failpoint: ``value["self_stopped"]``). With ``value["takeover"]`` the
    coordinator gives up on it and launches the next epoch; SIGCONT comes
    ``value["resume_s"]`` after that next driver's first step, else after the pause; and
    at once when ``release()`` is called or the coordinator settles, so no driver stays
    stopped past the run. ``ok`` once continued; ``info`` if it died while stopped."""

    kinds = frozenset({"pause"})

    def __init__(self, coordinator: Pausable) -> None:
        self.coordinator = coordinator
        self._release = asyncio.Event()

    def release(self) -> None:
        """Continue every paused driver now (the run is ending)."""
        self._release.set()

    async def _until_released(self, delay: float) -> None:
        await until_released(self.coordinator, self._release, delay)

    async def _next_first_step(self, epoch: int) -> None:
        await next_first_step(self.coordinator, epoch, self._release)

    async def invoke(self, op: Op) -> Op:
        v = dict(op.value or {})
        epoch = int(v["epoch"])
        a = next((x for x in self.coordinator.history if x.epoch == epoch), None)
        if a is None or not a.alive:
            return _done(op, "fail", error="no such driver running")
        if not v.get("self_stopped"):
            try:
                os.kill(a.pid, signal.SIGSTOP)
            except ProcessLookupError:
                return _done(op, "fail", error="the driver exited first")
            for _ in range(200):
                if is_stopped(a.pid) or not a.alive:
                    break
                await asyncio.sleep(0.01)
        v["stopped_ms"] = time.time() * 1000
        if v.get("takeover"):
            if self.coordinator.current is a:
                self.coordinator.abandon_current("paused")
            await self._next_first_step(epoch)
        await self._until_released(float(v.get("resume_s", 0.0)))
        try:
            os.kill(a.pid, signal.SIGCONT)
        except ProcessLookupError:
            return _done(op, "info", v, error="the driver died while stopped")
        v["continued_ms"] = time.time() * 1000
        v["pid"] = a.pid
        return _done(op, "ok", value=v)


async def next_first_step(
    coordinator: Pausable, epoch: int, release: asyncio.Event, within: float = TAKEOVER_WAIT_S
) -> None:
    """Until a driver newer than ``epoch`` made its first step, or at most ``within``
    seconds: the newer one may need what the older one holds (a lock it was stopped
    inside, the log's write transaction), and a stopped process does resume in the end
    (a stuck call returns when the disk comes back)."""
    deadline = time.monotonic() + within
    while not (release.is_set() or coordinator.settled.is_set()):
        if any(a.epoch > epoch and a.first_step_ms for a in coordinator.history):
            return
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(0.02)


async def until_released(coordinator: Pausable, release: asyncio.Event, delay: float) -> None:
    """``delay`` seconds, or less: until ``release`` is set or the coordinator settles."""
    waits = [release.wait(), coordinator.settled.wait()]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_first(waits), delay)


async def _first(waits: list[Any]) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


class SpaceNemesis:
    """``daemon_kill`` / ``space_restart`` / ``space_remove`` / ``space_pause`` of one named
    Space (``space_pause`` freezes the whole machine for ``value["duration_s"]``).

    A backend error leaves the outcome unknown (``info``): the fault may have happened.
    """

    _METHODS = {
        "daemon_kill": "kill_daemon",
        "space_restart": "restart",
        "space_remove": "delete",
        "space_pause": "pause",
    }

    def __init__(
        self, backend: SpaceBackend, name: str, kinds: Iterable[str] | None = None
    ) -> None:
        self.backend = backend
        self.name = name
        self.kinds = frozenset(self._METHODS if kinds is None else kinds)
        unknown = self.kinds - set(self._METHODS)
        if unknown:
            raise ValueError(f"SpaceNemesis cannot do {sorted(unknown)}")

    async def invoke(self, op: Op) -> Op:
        method = getattr(self.backend, self._METHODS[op.kind])
        try:
            await method(self.name)
            if op.kind == "space_pause":
                try:
                    await asyncio.sleep(float((op.value or {}).get("duration_s", 1.0)))
                finally:
                    await asyncio.shield(self.backend.resume(self.name))  # type: ignore[attr-defined]
        except Exception as e:
            return _done(op, "info", error=f"{type(e).__name__}: {e}")
        return _done(op, "ok", value=op.value if op.kind == "space_pause" else self.name)


class LosesPower(Protocol):
    """A machine that can lose power (``campaigns/power.py``): every process on it killed,
    its unsynced writes dropped, booted again. Returns what the cut dropped."""

    async def power_loss(self, value: Mapping[str, Any]) -> dict[str, Any]: ...


class PowerLoss:
    """``power_loss`` of a ``LosesPower``. ``ok`` with the cut's report; ``info`` on an error
    (the power may have gone, or only some processes)."""

    kinds = frozenset({"power_loss"})

    def __init__(self, host: LosesPower) -> None:
        self.host = host

    async def invoke(self, op: Op) -> Op:
        try:
            report = await self.host.power_loss(dict(op.value or {}))
        except Exception as e:
            return _done(op, "info", error=f"{type(e).__name__}: {e}")
        return _done(op, "ok", value={**dict(op.value or {}), **report})


class LogStorage(Protocol):
    """The log's storage, on a mount of its own that can lose power
    (``campaigns/log_loss.py``): its drivers killed, its unsynced writes dropped; nothing
    else touched. Returns what the cut dropped."""

    async def log_loss(self, value: Mapping[str, Any]) -> dict[str, Any]: ...


class LogLoss:
    """``log_loss`` of a ``LogStorage``. ``ok`` with the cut's report; ``info`` on an
    error (the drivers may have died, the cut not come)."""

    kinds = frozenset({"log_loss"})

    def __init__(self, storage: LogStorage) -> None:
        self.storage = storage

    async def invoke(self, op: Op) -> Op:
        try:
            report = await self.storage.log_loss(dict(op.value or {}))
        except Exception as e:
            return _done(op, "info", error=f"{type(e).__name__}: {e}")
        return _done(op, "ok", value={**dict(op.value or {}), **report})


class StallableDisk(Protocol):
    """A disk that can stop completing durability calls (``campaigns/power.py``'s host,
    over ``chaos/powerfs/disk.py``): ``stall`` for at most that long, ``resume`` (only new
    calls with ``keep_stuck``), and the processes stuck inside a call now (and the files)."""

    def stall(self, seconds: float) -> Any: ...

    def resume(self, *, keep_stuck: bool = ...) -> Any: ...

    def held(self) -> tuple[list[int], list[str]]: ...


class DiskStaller:
    """``disk_stall``: the host's disk stalls (every durability call held) and the driver
    of ``value["epoch"]`` goes on (continued, if it stopped itself at the fault's point)
    into its next durability call and is stuck there. Without ``takeover`` the disk comes
    back after ``duration_s``. With it, once a process of the host is stuck (within
    ``duration_s``), the disk serves new calls again while the stuck ones stay held, the
    coordinator gives up on the driver and launches the next epoch, and the stuck calls
    complete ``resume_s`` after that driver's first step, or after ``duration_s`` if the
    newer one cannot step (it waits for the log's write lock the stuck one holds); at
    once at ``release()`` or when the coordinator settles: the old driver then races its
    successor. ``ok`` with
    who was stuck (``held_pids``, ``driver_held``); ``info`` on an error of the disk."""

    kinds = frozenset({"disk_stall"})

    def __init__(self, disk: StallableDisk, coordinator: Pausable) -> None:
        self.disk = disk
        self.coordinator = coordinator
        self._release = asyncio.Event()

    def release(self) -> None:
        """Bring the disk back now (the run is ending)."""
        self._release.set()

    async def _held(self, alive: Callable[[], bool], within: float) -> tuple[list[int], list[str]]:
        """Who is stuck in a durability call (and in which files) once a process of the
        host is (the lab's own calls aside), or after ``within``."""
        deadline = time.monotonic() + within
        mine = os.getpid()
        while True:
            pids, paths = await asyncio.to_thread(self.disk.held)
            held = [p for p in pids if p != mine]
            if held or not alive() or time.monotonic() > deadline or self._release.is_set():
                return held, paths
            await asyncio.sleep(0.01)

    async def invoke(self, op: Op) -> Op:
        v = dict(op.value or {})
        epoch = int(v["epoch"])
        a = next((x for x in self.coordinator.history if x.epoch == epoch), None)
        if a is None or not a.alive:
            if v.get("self_stopped") and a is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(a.pid, signal.SIGCONT)
            return _done(op, "fail", error="no such driver running")
        duration = float(v.get("duration_s", 1.0))
        # the disk's own deadline bounds the stall whatever happens to this task
        bound = duration + TAKEOVER_WAIT_S + float(v.get("resume_s", 0.0)) + 5.0
        try:
            await asyncio.to_thread(self.disk.stall, bound)
            t0 = time.monotonic()
            v["stalled_ms"] = time.time() * 1000
            if v.get("self_stopped"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(a.pid, signal.SIGCONT)
            held, v["held_paths"] = await self._held(lambda: a.alive, duration)
            v["held_pids"] = held
            v["driver_held"] = a.pid in held
            if v.get("takeover") and held and self.coordinator.current is a:
                await asyncio.to_thread(self.disk.resume, keep_stuck=True)
                self.coordinator.abandon_current("disk_stall")
                v["taken_over"] = True
                await next_first_step(self.coordinator, epoch, self._release, duration)
                await until_released(self.coordinator, self._release, float(v.get("resume_s", 0.0)))
            else:
                left = max(0.0, duration - (time.monotonic() - t0))
                await until_released(self.coordinator, self._release, left)
        except Exception as e:
            return _done(op, "info", v, error=f"{type(e).__name__}: {e}")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(asyncio.to_thread(self.disk.resume))
        v["resumed_ms"] = time.time() * 1000
        v["pid"] = a.pid
        return _done(op, "ok", value=v)


class Composed:
    """Routes each op to the one nemesis that claims its kind and records the history."""

    def __init__(self, routes: Mapping[str, Nemesis]) -> None:
        self.routes = dict(routes)
        self.kinds = frozenset(self.routes)
        self.history: list[Op] = []

    async def invoke(self, op: Op) -> Op:
        nem = self.routes.get(op.kind)
        if nem is None:
            raise ValueError(f"no nemesis claims op kind {op.kind!r}")
        done = await nem.invoke(op)
        self.history.append(done)
        return done

    async def inflict(self, kind: str, value: Any = None) -> Op:
        """Shorthand: invoke a fresh op of ``kind``."""
        return await self.invoke(Op(kind, value=value))

    def counts(self, types: Iterable[str] = ("ok", "info")) -> dict[str, int]:
        """Faults per kind that happened (``ok``) or may have (``info``)."""
        keep = set(types)
        c: Counter[str] = Counter(op.kind for op in self.history if op.type in keep)
        return dict(sorted(c.items()))


def compose(nemeses: Mapping[Any, Nemesis] | Iterable[Nemesis]) -> Composed:
    """One nemesis from many, routed by op kind.

    A mapping's keys are a kind or an iterable of kinds each value handles; a plain
    iterable uses each nemesis's own ``kinds``. Two nemeses claiming one kind is an error.
    """
    pairs: list[tuple[Iterable[str], Nemesis]]
    if isinstance(nemeses, Mapping):
        pairs = [([k] if isinstance(k, str) else list(k), n) for k, n in nemeses.items()]
    else:
        pairs = [(n.kinds, n) for n in nemeses]
    routes: dict[str, Nemesis] = {}
    for kinds, nem in pairs:
        for kind in kinds:
            if kind in routes:
                raise ValueError(f"two nemeses claim op kind {kind!r}")
            if kind not in nem.kinds:
                raise ValueError(f"{type(nem).__name__} cannot do {kind!r}")
            routes[kind] = nem
    return Composed(routes)
