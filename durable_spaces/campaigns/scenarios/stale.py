"""``stale``: an older driver runs on while a newer one takes over; it must be fenced.

A second coordinator takes over (a new epoch) while the first one's driver still runs (a
coordinator restarted on another machine, a partition): the old driver must be fenced by
the log and the Space, and never add to the log.

In most runs the old driver is *paused* first: it stops itself (SIGSTOP) at a drawn
pause point, with a Space mutation ahead of it or in flight; the takeover starts at once,
and the old driver is continued ``resume_s`` after the new one's first step (or when the
session ends). It must then change nothing and exit fenced (``stale_driver_fenced``; the
workspace and epoch checks confirm it changed nothing). The newer coordinator's session
carries the run's drawn schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Mapping
from typing import Any

from durable_spaces.campaigns.checks.verdict import Verdict
from durable_spaces.campaigns.evidence import Evidence, RunCheck
from durable_spaces.campaigns.scenarios.base import Context, Driven, OneSession, Script
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.chaos import points
from durable_spaces.chaos.nemesis import TAKEOVER_WAIT_S, is_stopped
from durable_spaces.chaos.schedule import PAUSE_POINTS, Failpoint
from durable_spaces.drive.coordinator import Attempt, Coordinator, CoordinatorResult, Launch
from durable_spaces.drive.protocol import EXIT_DONE, EXIT_FENCED, EXIT_PERMANENT

#: Seconds each scripted shell command sleeps: a driver still busy at the takeover.
SLEEP_S = 0.4
#: How often the old driver is paused (else it simply runs on).
STALE_PAUSE_P = 0.7
#: Where the driver before a recovery-pausing old driver dies (the call's fate unknown).
CRASH_BEFORE_PAUSE = (points.ADAPTER_MID_CALL, points.ADAPTER_FILE_OP, points.ADAPTER_START_MARK)
#: Pause points on a resumer's path: the Space is being brought back to the log.
RECOVERY_PAUSE_POINTS = (
    points.RECOVERY_START,
    points.IMAGE_APPLY_OP,
    points.SNAPSHOTS_RESTORE,
    points.SPACE_MUTATE,
)
#: Pause points a run never reaches, by backend and by adapter mode.
UNREACHABLE_BY_BACKEND = {"local": {points.SPACE_MUTATE_STARTED}}  # local writes in-process
UNREACHABLE_BY_MODE = {
    "transactional": {points.SNAPSHOTS_RESTORE},
    "checkpoint": {points.IMAGE_APPLY_OP},
}


class Stale(OneSession):
    name = "stale"

    def script(self, run: RunSpec) -> Script:
        return Script(run.seed, SLEEP_S)

    async def drive(self, run: RunSpec, ctx: Context) -> Driven:
        rng = random.Random(f"{run.seed}:stale")
        delay = rng.uniform(0.0, 1.0)
        pause: Failpoint | None = None
        crash: Failpoint | None = None
        resume_s = 0.0
        if rng.random() < STALE_PAUSE_P:
            unreachable = UNREACHABLE_BY_BACKEND.get(run.backend, set()) | (
                UNREACHABLE_BY_MODE.get(run.durable_mode, set())
            )
            choices = [x for x in PAUSE_POINTS if x not in unreachable]
            if rng.random() < 0.5:
                # The old driver is itself a resumer: the one before it died mid-call, so
                # it pauses inside recovery (a revert, a restore) with the call's fate
                # decided.
                crash = Failpoint(rng.choice(CRASH_BEFORE_PAUSE), 1)
                choices = [x for x in choices if x in RECOVERY_PAUSE_POINTS]
            at = rng.choice(sorted(choices))  # drawn before the hit number, as ever
            pause = Failpoint(at, 1 if crash else rng.randint(1, 2), "pause")
            resume_s = round(rng.uniform(0.0, 1.5), 3)

        def arm(launch: Launch) -> None:
            fp = crash if crash is not None and launch.index == 0 else pause
            launch.env["DS_FAILPOINTS"] = fp.spec() if fp is not None else ""

        # The old driver's own coordinator must not replace it while it is stopped: it is
        # the one that lost contact, and has no newer epoch to give.
        first = ctx.coordinator(
            max_attempts=2 if crash is not None else 1,
            stall_secs=3600.0,
            backoff=(0.05, 0.05, 1.0),
            before_launch=[arm],
        )
        first_task = asyncio.create_task(first.run())
        await _until_working(first, first_task, paused=pause is not None)
        old = first.current
        paused = old is not None and old.alive and is_stopped(old.pid)
        if not paused:
            await asyncio.sleep(delay)
        taking: list[Coordinator] = []
        second = asyncio.create_task(ctx.drive(kill_orphans=False, seen=taking))
        if paused and old is not None:
            await _resume_after_takeover(old, taking, second, resume_s)
        second_result, injector = await second
        if old is not None and old.alive and is_stopped(old.pid):
            os.kill(old.pid, signal.SIGCONT)
        first_result = await first_task
        second_start = min(
            (e["unix_ms"] for e in second_result.events if e.get("event") == "launch"),
            default=None,
        )
        overlapped = bool(
            old is not None
            and old.ended_ms is not None
            and second_start is not None
            and old.ended_ms > second_start
        )
        merged = CoordinatorResult(
            status=second_result.status,
            attempts=first_result.attempts + second_result.attempts,
            epochs=first_result.epochs + second_result.epochs,
            exit_codes=first_result.exit_codes + second_result.exit_codes,
            events=first_result.events + second_result.events,
            resumes=second_result.resumes,
            reason=second_result.reason,
        )
        extra: dict[str, Any] = {
            "stale_overlapped": overlapped,
            "old_exit": old.exit_code if old is not None else None,
            "stale_pause": None
            if pause is None
            else {
                **pause.to_json(),
                "paused": paused,
                "after_crash": None if crash is None else crash.spec(),
            },
        }
        return Driven(merged, injector, extra)

    def checks(self) -> Mapping[str, RunCheck]:
        return {"stale_driver_fenced": stale_driver_fenced}


def stale_driver_fenced(ev: Evidence) -> Verdict:
    """The old driver, if it still ran when the newer one started, was fenced (75), or
    finished first, or stopped without a verdict of its own; never exited as if it were
    current while superseded."""
    overlapped = bool(ev.facts.get("stale_overlapped"))
    code = ev.facts.get("old_exit")
    pause = ev.facts.get("stale_pause")
    paused = bool(pause and pause.get("paused"))
    if not overlapped:
        return {"valid": True, "detail": f"old driver ended ({code}) before the takeover"}
    if code == EXIT_FENCED:
        return {"valid": True, "detail": "old driver was fenced (exit 75)"}
    if code == EXIT_DONE and not paused:
        return {"valid": True, "detail": "old driver finished before being fenced"}
    if code not in (None, EXIT_DONE, EXIT_PERMANENT):
        # e.g. halted (exit 1) because a Space fault hit its command: it stopped without
        # recording anything, which no_stale_writes and the workspace checks confirm.
        return {"valid": True, "detail": f"old driver stopped (exit {code})"}
    return {"valid": False, "detail": f"old driver exited {code} while superseded"}


async def _until_working(first: Coordinator, task: asyncio.Task[Any], paused: bool) -> None:
    """Until the first driver really works (its first step) or has stopped itself at its
    pause point (at most 20 s)."""
    for _ in range(400):
        cur = first.current
        working = cur is not None and not paused and cur.first_step_ms is not None
        if working or (cur is not None and is_stopped(cur.pid)) or task.done():
            break
        await asyncio.sleep(0.05)


async def _resume_after_takeover(
    old: Attempt, taking: list[Coordinator], second: asyncio.Task[Any], resume_s: float
) -> None:
    """SIGCONT a paused old driver ``resume_s`` after a newer driver's first step, or as
    soon as the takeover's session ends."""
    deadline = time.monotonic() + TAKEOVER_WAIT_S  # it may hold what the newer one needs
    while not second.done() and time.monotonic() < deadline:
        if any(a.first_step_ms for c in taking for a in c.history):
            break
        await asyncio.sleep(0.02)
    if not second.done():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(second), resume_s)
    if old.alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(old.pid, signal.SIGCONT)


SCENARIO = Stale()
