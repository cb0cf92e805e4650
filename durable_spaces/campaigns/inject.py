"""Carrying out a schedule against a coordinated session.

The schedule says what goes wrong per attempt; the ``Injector`` makes it happen at the
right moments of a ``Coordinator``'s run, through a composed nemesis:

- before each launch: the attempt's failpoint goes into the driver's environment
  (``DS_FAILPOINTS``, or empty to disarm);
- before each launch after a driver died by SIGKILL (a failpoint, a random kill, a
  stall): the previous attempt's ``after_kill`` Space faults, awaited, so they land
  between the death and ``place_space()``;
- during each attempt: its random-time kills and timed Space faults, measured from the
  launch; one whose attempt has already ended is skipped (not counted).

What happened is read back from the nemesis history and the attempts, never from the
schedule: a planned fault that did not land is not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import Counter
from dataclasses import dataclass, field

from durable_spaces.campaigns.coordinator import Attempt, Coordinator, CoordinatorResult, Launch
from durable_spaces.chaos.nemesis import Composed
from durable_spaces.chaos.schedule import Schedule


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
        coordinator.before_launch.append(self._before_launch)

    async def _before_launch(self, launch: Launch) -> None:
        launch.env.update(self.schedule.plan(launch.index).env())
        if launch.index == 0:
            return
        prev = self.coordinator.history[launch.index - 1]
        if prev.exit_code == -signal.SIGKILL:
            for f in self.schedule.plan(prev.index).faults:
                if f.trigger == "after_kill":
                    await self.nemesis.inflict(f.kind, {"epoch": prev.epoch, "after": "kill"})

    async def _at(self, attempt: Attempt, delay: float, kind: str) -> None:
        try:
            await asyncio.wait_for(attempt.done.wait(), delay)
            return  # the attempt ended first: skip
        except TimeoutError:
            pass
        if attempt.alive:
            await self.nemesis.inflict(kind, {"epoch": attempt.epoch, "at_s": delay})

    async def run(self) -> None:
        """Until the coordinator's run ends; pending timed faults are cancelled then."""
        try:
            async for a in self._attempts:
                plan = self.schedule.plan(a.index)
                timed = [(d, "kill") for d in plan.kill_after_s]
                timed += [(f.at_s, f.kind) for f in plan.faults if f.at_s is not None]
                for delay, kind in timed:
                    t = asyncio.create_task(self._at(a, delay, kind))
                    self._tasks.add(t)
                    t.add_done_callback(self._tasks.discard)
        finally:
            for t in list(self._tasks):
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

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
