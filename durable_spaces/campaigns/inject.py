"""Carrying out a schedule against a coordinated session, and recording what landed where.

The schedule says what goes wrong per attempt; the ``Injector`` makes it happen at the
right moments of a ``Coordinator``'s run, through a composed nemesis:

- before each launch: the attempt's failpoint and a ``stop`` at every point fault's
  position go into the driver's environment (``DS_FAILPOINTS``), with a trace file of
  its own (``DS_FAILPOINT_TRACE``); the attempt's ``at_launch`` Space faults land; after
  a driver died by SIGKILL (a failpoint, a random kill, a stall) the previous attempt's
  ``after_kill`` faults land first, between the death and ``place_space()``;
- at a point fault's position the driver stops itself (a rendezvous): the watcher sees
  it stopped at that hit, the faults placed there land (in order), and the driver is
  continued (or killed, or handed to the pause nemesis). A pause failpoint is watched
  for the same way;
- random-time kills, and pauses/faults the profile places in time, fire at their
  seconds after the launch; one whose attempt has already ended is skipped.

A fault is never cut half-way: once its op is invoked it runs to its end (shielded), and
``finish()`` (after the coordinator's run) continues paused drivers and waits for every
op in flight; ops still waiting for their moment are cancelled and recorded as such.

``realized`` is the run's interleaving as data, in the order things happened: every
fault with the attempt it hit and its position (a point and hit number; for a timed
fault, the last point its driver had passed; for a trigger, the trigger), its outcome
(``ok``, ``info``, ``fail``) or ``cancelled``. ``Schedule.exact`` turns it back into a
schedule that replays it, and two runs of one logical schedule realize the same list.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_spaces.chaos.failpoints import ANY
from durable_spaces.chaos.nemesis import Composed, DiskStaller, DriverPauser, Op, is_stopped
from durable_spaces.chaos.schedule import AttemptPlan, PointFault, Schedule
from durable_spaces.drive.coordinator import Attempt, Coordinator, CoordinatorResult, Launch

#: How often a watcher looks for its driver stopped at a rendezvous.
WATCH_S = 0.005


@dataclass
class Injected:
    """What the run went through: the figures a RunRecord carries."""

    kills: int
    faults: dict[str, int]
    attempts: int
    resume_latencies_ms: list[float]
    resume_backoffs_ms: list[float] = field(default_factory=list)
    stalls: int = 0


def last_hit(trace: Path) -> tuple[str, int, int | None] | None:
    """The last whole ``point n g`` line of a failpoint trace (None: no hit yet)."""
    try:
        with open(trace, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            tail = f.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    for line in reversed(tail.split("\n")[:-1]):  # the part after the last \n is torn
        parts = line.split()
        if len(parts) in (3, 5) and parts[1].isdigit():
            return parts[0], int(parts[1]), int(parts[2]) if parts[2].isdigit() else None
    return None


class Injector:
    """Create it before ``coordinator.run()``; run ``injector.run()`` beside it.
    ``traces`` is where each attempt's driver writes its failpoint trace."""

    def __init__(
        self,
        coordinator: Coordinator,
        schedule: Schedule,
        nemesis: Composed,
        traces: Path | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.schedule = schedule
        self.nemesis = nemesis
        self.traces = traces
        if traces is not None:
            traces.mkdir(parents=True, exist_ok=True)
        self._attempts = coordinator.attempts()  # subscribe before the first launch
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: set[asyncio.Future[Op]] = set()
        self._t0 = time.monotonic()
        #: The realized interleaving (see the module doc).
        self.realized: list[dict[str, Any]] = []
        coordinator.before_launch.append(self._before_launch)

    @property
    def cancelled(self) -> list[dict[str, Any]]:
        return [r for r in self.realized if r["type"] == "cancelled"]

    def trace_of(self, index: int) -> Path | None:
        return None if self.traces is None else self.traces / f"attempt-{index}.trace"

    def _position(self, attempt: Attempt) -> dict[str, Any]:
        """Where a timed fault lands: the last point the attempt's driver passed."""
        trace = self.trace_of(attempt.index)
        hit = last_hit(trace) if trace is not None else None
        t = round(time.monotonic() - self._t0, 3)
        if hit is None:
            return {"after_s": t}
        return {"after_s": t, "point": hit[0], "n": hit[1], "g": hit[2]}

    def _record(
        self, attempt: int, epoch: int, kind: str, type_: str, at: Mapping[str, Any], value: Any
    ) -> None:
        self.realized.append(
            {
                "attempt": attempt,
                "epoch": epoch,
                "kind": kind,
                "type": type_,
                "at": dict(at),
                "value": {k: v for k, v in dict(value or {}).items() if k != "epoch"},
            }
        )

    async def _invoke(
        self, attempt: Attempt, kind: str, value: dict[str, Any], at: Mapping[str, Any]
    ) -> Op:
        """Invoke an op that must not be cut half-way: shielded from cancellation, and
        awaited by ``finish()`` however the run ends; recorded where it landed."""
        fut = asyncio.ensure_future(self.nemesis.inflict(kind, value))
        self._in_flight.add(fut)
        fut.add_done_callback(self._in_flight.discard)
        op = await asyncio.shield(fut)
        # what the fault found where it landed, or why it could not land
        seen = {**value, **(op.found or {}), **({"error": op.error} if op.error else {})}
        self._record(attempt.index, attempt.epoch, kind, op.type, at, seen)
        return op

    async def finish(self) -> None:
        """After the coordinator's run: continue paused drivers, let every op in flight end,
        cancel (and record) the ones still waiting."""
        for nem in self.nemesis.routes.values():
            if isinstance(nem, DriverPauser | DiskStaller):
                nem.release()  # continue paused drivers, bring a stalled disk back
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def _before_launch(self, launch: Launch) -> None:
        plan = self.schedule.plan(launch.index)
        launch.env.update(plan.env())
        trace = self.trace_of(launch.index)
        if trace is not None:
            launch.env["DS_FAILPOINT_TRACE"] = str(trace)
        pseudo = Attempt(launch.index, launch.epoch, 0, 0.0, process=None)  # type: ignore[arg-type]
        if launch.index > 0:
            prev = self.coordinator.history[launch.index - 1]
            if prev.exit_code == -signal.SIGKILL:
                for f in self.schedule.plan(prev.index).faults:
                    if f.trigger == "after_kill":
                        await self._trigger(prev, f.kind, f.duration_s, "after_kill")
        for f in plan.faults:
            if f.trigger == "at_launch":
                await self._trigger(pseudo, f.kind, f.duration_s, "at_launch")

    async def _trigger(
        self, attempt: Attempt, kind: str, duration: float | None, trigger: str
    ) -> None:
        value: dict[str, Any] = {"epoch": attempt.epoch, "trigger": trigger}
        if duration is not None:
            value["duration_s"] = duration
        await self._invoke(attempt, kind, value, {"trigger": trigger})

    async def _at(
        self, attempt: Attempt, delay: float, kind: str, extra: Mapping[str, Any] | None = None
    ) -> None:
        value: dict[str, Any] = {"epoch": attempt.epoch, "at_s": delay, **(extra or {})}
        try:
            await asyncio.wait_for(attempt.done.wait(), delay)
            return  # the attempt ended first: skip
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            self._record(attempt.index, attempt.epoch, kind, "cancelled", {"at_s": delay}, value)
            raise
        if attempt.alive and attempt.abandoned_ms is None:
            await self._invoke(attempt, kind, value, self._position(attempt))

    async def _watch(self, attempt: Attempt, plan: AttemptPlan) -> None:
        """Rendezvous: each time the driver is seen stopped, inflict what is placed at the
        hit it stopped at, then let it go on."""
        by_pos: dict[tuple[str, int], list[PointFault]] = {}
        for pf in plan.at_points:
            by_pos.setdefault(pf.position, []).append(pf)
        pause_fp = plan.failpoint if plan.failpoint and plan.failpoint.action == "pause" else None
        pause = next((p for p in plan.pauses if p.at_s is None), None)
        trace = self.trace_of(attempt.index)
        try:
            while attempt.alive:
                if attempt.abandoned_ms is not None or not is_stopped(attempt.pid):
                    await asyncio.sleep(WATCH_S)
                    continue
                hit = last_hit(trace) if trace is not None else None
                if (
                    pause_fp is not None
                    and pause is not None
                    and (hit is None or (hit[0], hit[1]) == (pause_fp.name, pause_fp.n))
                ):
                    at: dict[str, Any] = {"point": pause_fp.name, "n": pause_fp.n}
                    value: dict[str, Any] = {
                        "epoch": attempt.epoch,
                        "self_stopped": True,
                        "takeover": pause.takeover,
                        "resume_s": pause.resume_s,
                    }
                    pause_fp = None
                    await self._invoke(attempt, "pause", value, at)
                    continue
                faults: list[PointFault] = []
                if hit is not None:
                    faults = by_pos.pop((hit[0], hit[1]), [])
                    if hit[2] is not None:
                        faults += by_pos.pop((ANY, hit[2]), [])
                if not faults:
                    # Stopped by someone else (the pause nemesis) or at a point this plan
                    # does not know: not ours to continue.
                    await asyncio.sleep(WATCH_S)
                    continue
                await self._rendezvous(attempt, faults, hit)
        finally:
            # The attempt ended (its driver exited, or finish() cancelled this watch): what
            # never met its point is recorded as cancelled either way. Before, only the
            # cancellation recorded them, so a driver that exited first (a loaded machine)
            # left them out of the interleaving.
            for pfs in by_pos.values():
                for pf in pfs:
                    at = {"point": pf.point, "n": pf.n}
                    self._record(attempt.index, attempt.epoch, pf.kind, "cancelled", at, {})

    async def _rendezvous(
        self, attempt: Attempt, faults: list[PointFault], hit: tuple[str, int, int | None] | None
    ) -> None:
        handed_on = False
        trace = self.trace_of(attempt.index)
        for pf in faults:
            at: dict[str, Any] = {"point": pf.point, "n": pf.n}
            if hit is not None and pf.point == ANY:
                at["hit"] = [hit[0], hit[1]]
            value: dict[str, Any] = {"epoch": attempt.epoch}
            if pf.kind in ("pause", "disk_stall"):
                value.update(self_stopped=True, takeover=pf.takeover, resume_s=pf.resume_s)
                handed_on = True  # the pause (or disk stall) nemesis continues it
            if pf.duration_s is not None:
                value["duration_s"] = pf.duration_s
            if pf.kind in ("kill", "power_loss", "log_loss"):
                handed_on = True  # the driver is dead (a power or log loss kills it too)
            op = await self._invoke(attempt, pf.kind, value, at)
            if trace is not None and pf.kind not in ("pause", "disk_stall"):
                # Where the driver was when the fault had landed: its stop, if the
                # rendezvous held (a replay compares this, so a fault that slipped is seen).
                now = last_hit(trace)
                self.realized[-1]["at"]["landed"] = None if now is None else [now[0], now[1]]
            if pf.kind in ("kill", "power_loss", "log_loss") and op.type != "ok":
                handed_on = False
        if not handed_on and attempt.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(attempt.pid, signal.SIGCONT)

    def _start(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def run(self) -> None:
        """Schedule each attempt's faults as it is launched, until the coordinator's run
        ends (``finish()`` then settles what is pending)."""
        async for a in self._attempts:
            plan = self.schedule.plan(a.index)
            for d in plan.kill_after_s:
                self._start(self._at(a, d, "kill"))
            for f in plan.faults:
                if f.at_s is not None:
                    extra: dict[str, Any] = {}
                    if f.duration_s is not None:
                        extra["duration_s"] = f.duration_s
                    if f.kind == "disk_stall":
                        extra.update(takeover=f.takeover, resume_s=f.resume_s)
                    self._start(self._at(a, f.at_s, f.kind, extra))
            for p in plan.pauses:
                if p.at_s is not None:
                    extra = {"takeover": p.takeover, "resume_s": p.resume_s}
                    self._start(self._at(a, p.at_s, "pause", extra))
            if plan.at_points or (plan.failpoint and plan.failpoint.action == "pause"):
                self._start(self._watch(a, plan))

    def injected(self, result: CoordinatorResult) -> Injected:
        """Kills are drivers that died by SIGKILL (failpoint, nemesis or stall), not the
        coordinator's own clean-up at a timeout or exit."""
        hist = self.coordinator.history
        killed = [
            a
            for a in hist
            if a.exit_code == -signal.SIGKILL and a.killed_by not in ("timeout", "coordinator_exit")
        ]
        faults: Counter[str] = Counter(
            op.kind
            for op in self.nemesis.history
            if op.type in ("ok", "info") and op.kind != "kill"
        )
        if killed:
            faults["kill"] = len(killed)
        return Injected(
            kills=len(killed),
            faults=dict(sorted(faults.items())),
            attempts=result.attempts,
            resume_latencies_ms=result.resume_latencies_ms,
            resume_backoffs_ms=[r.backoff_ms for r in result.resumes],
            stalls=result.stalls,
        )
