"""Carrying out a schedule against a coordinated session.

The schedule says what goes wrong per attempt; the ``Injector`` makes it happen at the
right moments of a ``Coordinator``'s run, through a composed nemesis:

- before each launch: the attempt's failpoint goes into the driver's environment
  (``DS_FAILPOINTS``, or empty to disarm);
- before each launch after a driver died by SIGKILL (a failpoint, a random kill, a
  stall): the previous attempt's ``after_kill`` Space faults, awaited, so they land
  between the death and ``place_space()``;
- during each attempt: its random-time kills, pauses and timed Space faults, measured
  from the launch; one whose attempt has already ended is skipped (not counted);
- a pause failpoint stops the driver itself: it is watched for, and the pause op (the
  takeover and the later SIGCONT) starts the moment the driver is seen stopped.

A fault is never cut half-way: once its op is invoked it runs to its end (shielded), and
``finish()`` (after the coordinator's run) continues paused drivers and waits for every
op in flight; ops still waiting for their moment are cancelled and recorded as such
(``cancelled``). What happened is read back from the nemesis history and the attempts,
never from the schedule: a planned fault that did not land is not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_spaces.campaigns.coordinator import Attempt, Coordinator, CoordinatorResult, Launch
from durable_spaces.chaos.nemesis import Composed, DriverPauser, Op, is_stopped
from durable_spaces.chaos.schedule import DriverPause, Schedule


@dataclass
class Injected:
    """What the run went through: the figures a RunRecord carries."""

    kills: int
    faults: dict[str, int]
    attempts: int
    resume_latencies_ms: list[float]
    resume_backoffs_ms: list[float] = field(default_factory=list)
    stalls: int = 0


class Injector:
    """Create it before ``coordinator.run()``; run ``injector.run()`` beside it."""

    def __init__(self, coordinator: Coordinator, schedule: Schedule, nemesis: Composed) -> None:
        self.coordinator = coordinator
        self.schedule = schedule
        self.nemesis = nemesis
        self._attempts = coordinator.attempts()  # subscribe before the first launch
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: set[asyncio.Future[Op]] = set()
        #: Ops whose moment never came (the run ended first), as data for the record.
        self.cancelled: list[dict[str, object]] = []
        coordinator.before_launch.append(self._before_launch)

    async def _invoke(self, kind: str, value: dict[str, object]) -> Op:
        """Invoke an op that must not be cut half-way: shielded from cancellation, and
        awaited by ``finish()`` however the run ends."""
        fut = asyncio.ensure_future(self.nemesis.inflict(kind, value))
        self._in_flight.add(fut)
        fut.add_done_callback(self._in_flight.discard)
        return await asyncio.shield(fut)

    async def finish(self) -> None:
        """After the coordinator's run: continue paused drivers, let every op in flight end,
        cancel (and record) the ones still waiting."""
        for nem in self.nemesis.routes.values():
            if isinstance(nem, DriverPauser):
                nem.release()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def _before_launch(self, launch: Launch) -> None:
        launch.env.update(self.schedule.plan(launch.index).env())
        if launch.index == 0:
            return
        prev = self.coordinator.history[launch.index - 1]
        if prev.exit_code == -signal.SIGKILL:
            for f in self.schedule.plan(prev.index).faults:
                if f.trigger == "after_kill":
                    value: dict[str, object] = {"epoch": prev.epoch, "after": "kill"}
                    if f.duration_s is not None:
                        value["duration_s"] = f.duration_s
                    await self._invoke(f.kind, value)

    async def _at(
        self, attempt: Attempt, delay: float, kind: str, extra: Mapping[str, object] | None = None
    ) -> None:
        value: dict[str, object] = {"epoch": attempt.epoch, "at_s": delay, **(extra or {})}
        try:
            await asyncio.wait_for(attempt.done.wait(), delay)
            return  # the attempt ended first: skip
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            self.cancelled.append({"kind": kind, **value})
            raise
        if attempt.alive and attempt.abandoned_ms is None:
            await self._invoke(kind, value)

    async def _self_stop(self, attempt: Attempt, pause: DriverPause) -> None:
        """The attempt's pause failpoint stops the driver itself: take over from there."""
        try:
            while attempt.alive and not is_stopped(attempt.pid):
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            self.cancelled.append({"kind": "pause", "epoch": attempt.epoch, "at": "failpoint"})
            raise
        if attempt.alive:
            await self._invoke(
                "pause",
                {
                    "epoch": attempt.epoch,
                    "self_stopped": True,
                    "takeover": pause.takeover,
                    "resume_s": pause.resume_s,
                },
            )

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
                    extra = {} if f.duration_s is None else {"duration_s": f.duration_s}
                    self._start(self._at(a, f.at_s, f.kind, extra))
            for p in plan.pauses:
                if p.at_s is None:
                    if plan.failpoint is not None and plan.failpoint.action == "pause":
                        self._start(self._self_stop(a, p))
                    continue
                extra = {"takeover": p.takeover, "resume_s": p.resume_s}
                self._start(self._at(a, p.at_s, "pause", extra))

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
