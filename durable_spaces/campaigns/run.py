"""One campaign run: a scripted session re-driven through faults, then checked.

``run_one(run)`` is what the runner calls per run (in a worker process). It writes the
agent's configuration, draws (or takes) the run's schedule, starts a ``Coordinator`` that
re-drives ``python -m durable_spaces.campaigns.agent`` with a new epoch per attempt, and
plays the schedule's faults against it: failpoints armed in a driver, SIGKILLs at random
times, and Space faults (daemon kill, machine restart, Space removal) at a time or right
after a driver died. When the session settles, the checker compares the workspace with
the committed log, and the Spaces are deleted.

Modes: ``transactional`` / ``auto`` / ``checkpoint`` (the adapter mode under attack),
``stale`` (a second coordinator takes over while the first one's driver still runs; the
old driver must be fenced, never add to the log) and ``exhaustive`` (the runner hands each
run a single-failpoint schedule; see ``trace_hits``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from durable_spaces.backends import open_backend
from durable_spaces.campaigns.agent import AgentConfigFile
from durable_spaces.campaigns.checker import History, LaunchRecord, Workload, check_all, collect
from durable_spaces.campaigns.checks.kept import keep
from durable_spaces.campaigns.coordinator import Attempt, Coordinator, CoordinatorResult, Launch
from durable_spaces.campaigns.inject import Injector
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.spec import CampaignSpec, RunSpec
from durable_spaces.chaos.nemesis import (
    TAKEOVER_WAIT_S,
    Composed,
    DriverKiller,
    DriverPauser,
    Nemesis,
    SpaceNemesis,
    compose,
    is_stopped,
)
from durable_spaces.chaos.schedule import (
    PAUSE_POINTS,
    AttemptPlan,
    Failpoint,
    Schedule,
    exhaustive,
    read_trace,
)
from durable_spaces.errors import SpaceUnavailableError
from durable_spaces.space import space_name

#: Failpoints a scripted call passes through (the campaign draws kills among these).
POINTS = (
    "adapter.call",
    "adapter.start_mark",
    "adapter.spawn",
    "adapter.running",
    "adapter.mid_call",
    "adapter.exit",
    "adapter.file_op",
    "adapter.outcome_commit",
    "adapter.checkpoint",
    "adapter.checkpoint_commit",
    "harness.tool_returned",
    "harness.tool_result",
    "harness.intent",
    "recovery.start",
    "recovery.reverted",
    "recovery.restored",
    "recovery.reimaged",
)

AGENT_ARGV = (sys.executable, "-m", "durable_spaces.campaigns.agent")
#: ``1``: keep every run's checker inputs in ``<run>/kept`` (``durable-spaces ... --keep``).
KEEP_ENV = "CRASH_KEEP"
RUN_TIMEOUT_S = 240.0


def _sleep_for(seed: str) -> float:
    """How long each scripted shell command sleeps (widens the mid-command window)."""
    return random.Random(f"{seed}:sleep").choice([0.0, 0.05, 0.2, 0.5])


def _snapshots_kind(run: RunSpec) -> str:
    """Machine checkpoints where the backend has them and checkpoint mode is asked for."""
    return (
        "sandbox" if run.backend == "microvm" and run.durable_mode == "checkpoint" else "workspace"
    )


def model_seed(run: RunSpec) -> str:
    """The scripted agent's seed. Exhaustive runs are named ``<base>-<point>-<n>`` and all
    replay the script of ``<base>``, the one whose trace listed the points."""
    if run.mode == "exhaustive" and run.seed.count("-") >= 2:
        return run.seed.rsplit("-", 2)[0]
    return run.seed


def exhaustive_schedule(run: RunSpec) -> Schedule:
    """The single-failpoint schedule an exhaustive run's seed names."""
    _base, point, n = run.seed.rsplit("-", 2)
    return Schedule(run.seed, (AttemptPlan(failpoint=Failpoint(point, int(n))),), "exhaustive")


def _paths(run: RunSpec) -> dict[str, Path]:
    root = Path(run.state_dir)
    return {
        "root": root,
        "session": root / "session",
        "spaces": root / "spaces",
        "store": root / "store",
    }


async def fresh_dirs(run: RunSpec) -> dict[str, Path]:
    """A run starts from nothing: an earlier run's log, Spaces or checkpoints in the same
    directory would be resumed instead of tested."""
    p = _paths(run)
    if p["spaces"].exists():
        backend = open_backend(run.backend, p["spaces"])
        try:
            for name in await backend.names():
                await backend.delete(name)
        finally:
            await backend.close()
    for key in ("session", "spaces", "store"):
        shutil.rmtree(p[key], ignore_errors=True)
    return p


def write_config(run: RunSpec) -> dict[str, Path]:
    p = _paths(run)
    p["session"].mkdir(parents=True, exist_ok=True)
    seed = model_seed(run)
    AgentConfigFile(
        backend=run.backend,
        backend_dir=str(p["spaces"]),
        mode=run.durable_mode,
        seed=seed,
        calls=run.calls,
        store_dir=str(p["store"]),
        snapshots=_snapshots_kind(run),
        # Stale runs need a driver still busy when the next one takes over; server runs a
        # command still running when its driver is killed mid-call (so it is restored).
        sleep={"stale": 0.4, "server": 4.0}.get(run.mode, _sleep_for(seed)),
        # Auto runs get a small file limit now and then, so the switch to checkpoint mode
        # happens mid-run (outcome and switch in one commit, then the checkpoint).
        max_files=random.Random(f"{seed}:limit").choice([2, 3, 4, None])
        if run.durable_mode == "auto"
        else None,
        server=run.mode == "server",
    ).save(p["session"])
    return p


class Placement:
    """The coordinator's side of one run's Space: its fixed name (``CUA_SESSION_SPACE``),
    the backend handle the nemesis uses, and placing the Space again when it was lost."""

    def __init__(self, run: RunSpec, spaces_dir: Path) -> None:
        self.name = space_name(f"{run.run_id}/{model_seed(run)}")
        self.backend = open_backend(run.backend, spaces_dir)
        self.placed = 0

    async def place_space(self) -> None:
        """A removed Space is created again, empty (generation n+1, "from scratch"); the
        adapter rebuilds it from the log's image or the checkpoint store."""
        if self.placed and await self.backend.find(self.name) is None:
            await self.backend.create(self.name)
        self.placed += 1

    async def delete(self) -> None:
        with contextlib.suppress(Exception):
            for name in await self.backend.names():
                await self.backend.delete(name)
        with contextlib.suppress(Exception):
            await self.backend.close()


def _nemesis(coordinator: Coordinator, placement: Placement) -> Composed:
    routes: dict[Any, Nemesis] = {
        "kill": DriverKiller(coordinator),
        "pause": DriverPauser(coordinator),
        ("daemon_kill", "space_restart", "space_remove", "space_pause"): SpaceNemesis(
            placement.backend, placement.name
        ),
    }
    return compose(routes)


def _coordinator(run: RunSpec, p: dict[str, Path], placement: Placement, **kw: Any) -> Coordinator:
    return Coordinator(
        AGENT_ARGV,
        p["session"],
        run.run_id,
        stall_secs=kw.pop("stall_secs", 60.0),
        heartbeat_secs=2.0,
        backoff=kw.pop("backoff", (0.05, 0.4, 2.0)),
        max_attempts=kw.pop("max_attempts", 24),
        place_space=placement.place_space,
        env={"CUA_SESSION_SPACE": placement.name},
        timeout_secs=RUN_TIMEOUT_S,
        **kw,
    )


async def _drive(
    run: RunSpec,
    p: dict[str, Path],
    placement: Placement,
    schedule: Schedule,
    *,
    seen: list[Coordinator] | None = None,
    **kw: Any,
) -> tuple[CoordinatorResult, Injector]:
    coordinator = _coordinator(run, p, placement, **kw)
    if seen is not None:
        seen.append(coordinator)
    traces = p["root"] / "traces" / coordinator.id[:8]
    injector = Injector(coordinator, schedule, _nemesis(coordinator, placement), traces)
    inject = asyncio.create_task(injector.run())
    try:
        return await coordinator.run(), injector
    finally:
        inject.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await inject
        await injector.finish()  # every fault in flight lands whole before the check


async def server_survives(history: History, space: Any) -> dict[str, Any]:
    """The process started at step 0 is alive after the run, with the pid it started with
    (a machine restore brings back the same process, not a new one), and still beating."""
    started = next(
        (r.get("content", "") for r in history.results if "ds-server pid" in r.get("content", "")),
        "",
    )
    m = re.search(r"ds-server pid (\d+)", started)
    if m is None:
        return {"valid": False, "detail": "the server's start has no committed result"}
    probe = (
        "p=$(cat /tmp/ds-server.pid) && kill -0 $p && b=$(cat /tmp/ds-server.beat) && "
        'echo "$p $(( $(date +%s) - b ))"'
    )
    res = await space.exec(["sh", "-c", probe], key=None, epoch=await space.current_epoch())
    out = res.output.decode(errors="replace").split()
    if res.exit_code != 0 or len(out) != 2:
        return {"valid": False, "detail": f"server not running: {res.output[-200:]!r}"}
    pid, age = int(out[0]), int(out[1])
    if pid != int(m.group(1)):
        return {"valid": False, "detail": f"server pid {pid} is not the one started ({m.group(1)})"}
    if age > 3:
        return {"valid": False, "detail": f"server alive but its last beat is {age} s old"}
    return {"valid": True, "detail": f"server pid {pid} alive, beat {age} s ago"}


def _workload(session_dir: Path) -> Workload:
    cfg = AgentConfigFile.load(session_dir)
    return Workload(seed=cfg.seed, calls=cfg.calls, sleep=cfg.sleep, server=cfg.server)


async def _check(
    run: RunSpec, p: dict[str, Path], placement: Placement, events: list[dict[str, Any]]
) -> dict[str, Any]:
    """Every check of ``checker`` on the raw log, the raw workspace and the launch
    history ``events``; the inputs are kept in ``<run>/kept`` when ``CRASH_KEEP=1`` (the
    CLI's ``--keep``) or when a check is not valid."""
    log = p["session"] / "log.sqlite"
    if not log.exists():
        return {"log": {"valid": None, "detail": "no log was written", "anomalies": []}}
    workload = _workload(p["session"])
    launches = LaunchRecord.from_events(events)
    # A fault inflicted just as the run ended (a machine restart in flight) may still be
    # settling: read the workspace once the Space answers again.
    for attempt in range(6):
        space = await placement.backend.find(placement.name)
        if space is None:
            detail = f"Space {placement.name} is gone after the run"
            return {"space": {"valid": False, "detail": detail, "anomalies": []}}
        try:
            inputs = await collect(space, log, workload=workload, launches=launches)
            break
        except SpaceUnavailableError:
            if attempt == 5:
                raise
            await asyncio.sleep(0.5 * (attempt + 1))
    verdicts: dict[str, Any] = dict(check_all(inputs))
    if run.mode == "server":
        verdicts["server_survives"] = await server_survives(inputs.history, space)
    if os.environ.get(KEEP_ENV) == "1" or any(
        v.get("valid") is not True for v in verdicts.values()
    ):
        keep(p["root"], inputs)
    return verdicts


def server_schedule(run: RunSpec) -> Schedule:
    """Kill a driver right after a machine checkpoint, then the next one in the middle of
    a call (its outcome unknown), so the one after restores that checkpoint: the server
    started at step 0 must come back with it, same pid, still beating."""
    rng = random.Random(f"{run.seed}:server")
    after = Failpoint("adapter.checkpoint", rng.randint(2, max(2, run.calls - 2)))
    return Schedule(
        run.seed,
        (AttemptPlan(failpoint=after), AttemptPlan(failpoint=Failpoint("adapter.mid_call", 1))),
        "server",
    )


def schedule_of(run: RunSpec) -> Schedule:
    if run.schedule is not None:
        return run.schedule
    if run.mode == "exhaustive":
        return exhaustive_schedule(run)
    if run.mode == "server":
        return server_schedule(run)
    return Schedule.draw(run.seed, POINTS, run.calls, run.profile)


async def run_one(run: RunSpec) -> RunRecord:
    """Run, check and clean up one campaign run."""
    t0 = time.monotonic()
    await fresh_dirs(run)
    p = write_config(run)
    schedule = schedule_of(run)
    placement = Placement(run, p["spaces"])
    record = RunRecord(
        run_id=run.run_id,
        seed=run.seed,
        mode=run.mode,
        backend=run.backend,
        calls=run.calls,
        schedule=schedule.to_json(),
        durable_mode=run.durable_mode,
        repro=run.repro(),
    )
    try:
        if run.mode == "stale":
            result, injector, extra = await _drive_stale(run, p, placement, schedule)
            record.extra.update(extra)
        else:
            result, injector = await _drive(run, p, placement, schedule)
        _fill(record, result, injector)
        events = list(result.events)  # the launch history the checker reads
        if result.status == "done" and await placement.backend.find(placement.name) is None:
            # A removal that landed as the last driver finished: what the next session
            # would do is drive once more, rebuilding the Space before it reports done.
            calm = Schedule(run.seed, (), "manual")
            again, _ = await _drive(run, p, placement, calm)
            record.extra["redriven_after_late_removal"] = again.status
            events += again.events
        record.checks = await _check(run, p, placement, events)
        if run.mode == "stale":
            record.checks["stale_driver_fenced"] = record.extra.pop("stale_check")
        if result.status != "done":
            record.checks["coordinator"] = {
                "valid": False,
                "detail": f"session ended {result.status}: {result.reason}",
            }
        record.settle()
    except Exception as e:
        record.outcome = "lab_error"
        record.checks = {"run": {"valid": None, "detail": f"{type(e).__name__}: {e}"}}
    finally:
        await placement.delete()
        if record.outcome == "ok":
            # A consistent run's log stays for the report; its Spaces' state (machine
            # checkpoints are ~100 MB each) and checkpoint store go.
            for key in ("spaces", "store"):
                shutil.rmtree(p[key], ignore_errors=True)
        record.duration_s = round(time.monotonic() - t0, 3)
    return record


def _fill(record: RunRecord, result: CoordinatorResult, injector: Injector) -> None:
    recoveries: Counter[str] = Counter()
    by_mode: Counter[str] = Counter()  # every recovery event carries the mode it was decided in
    sequence: list[str] = []  # in order, per epoch: how the run went (replay compares it)
    for ev in result.events:
        data = ev.get("data") or {}
        if ev.get("event") == "driver_event" and data.get("event") == "recovery":
            recoveries[str(data.get("kind"))] += 1
            by_mode[f"{data.get('mode')}/{data.get('kind')}"] += 1
            sequence.append(f"{ev.get('epoch')}:{data.get('kind')}:{data.get('call')}")
    got = injector.injected(result)
    faults = dict(got.faults)
    # A driver killed by SIGKILL was shot by the nemesis (random_kill) or died at its
    # armed failpoint: count the two apart.
    random_kills = sum(
        1 for op in injector.nemesis.history if op.kind == "kill" and op.type == "ok"
    )
    faults.pop("kill", None)
    faults["random_kill"] = random_kills
    faults["failpoint"] = max(0, got.kills - random_kills)
    record.faults = dict(sorted((k, v) for k, v in faults.items() if v))
    record.kills = got.kills
    record.recoveries = dict(sorted(recoveries.items()))
    record.attempts = got.attempts
    record.resume_latencies_ms = [round(x, 1) for x in got.resume_latencies_ms]
    record.resume_backoffs_ms = [round(x, 1) for x in got.resume_backoffs_ms]
    record.extra.update(
        epochs=result.epochs,
        exit_codes=result.exit_codes,
        status=result.status,
        recoveries_by_mode=dict(sorted(by_mode.items())),
        nemesis=[op.to_json() for op in injector.nemesis.history],
        interleaving=injector.realized,
        recovery_sequence=sequence,
    )


async def _drive_stale(
    run: RunSpec, p: dict[str, Path], placement: Placement, schedule: Schedule
) -> tuple[CoordinatorResult, Injector, dict[str, Any]]:
    """A second coordinator takes over (a new epoch) while the first one's driver runs
    (a coordinator restarted on another machine, a partition): the old driver must be
    fenced by the log and the Space, and never add to the log.

    In most runs the old driver is *paused* first: it stops itself (SIGSTOP) at a drawn
    pause point, with a Space mutation ahead of it or in flight; the takeover starts at
    once, and the old driver is continued ``resume_s`` after the new one's first step (or
    when the session ends). It must then change nothing and exit fenced."""
    rng = random.Random(f"{run.seed}:stale")
    delay = rng.uniform(0.0, 1.0)
    pause: Failpoint | None = None
    crash: Failpoint | None = None
    resume_s = 0.0
    if rng.random() < STALE_PAUSE_P:
        unreachable = {
            "local": {"space.mutate_started"},  # local writes in-process, not by command
        }.get(run.backend, set()) | {
            "transactional": {"snapshots.restore"},
            "checkpoint": {"image.apply_op"},
        }.get(run.durable_mode or "", set())
        points = [x for x in PAUSE_POINTS if x not in unreachable]
        if rng.random() < 0.5:
            # The old driver is itself a resumer: the one before it died mid-call, so it
            # pauses inside recovery (a revert, a restore) with the call's fate decided.
            crash = Failpoint(rng.choice(CRASH_BEFORE_PAUSE), 1)
            points = [x for x in points if x in RECOVERY_PAUSE_POINTS]
        pause = Failpoint(rng.choice(sorted(points)), 1 if crash else rng.randint(1, 2), "pause")
        resume_s = round(rng.uniform(0.0, 1.5), 3)

    def arm(launch: Launch) -> None:
        fp = crash if crash is not None and launch.index == 0 else pause
        launch.env["DS_FAILPOINTS"] = fp.spec() if fp is not None else ""

    # The old driver's own coordinator must not replace it while it is stopped: it is
    # the one that lost contact, and has no newer epoch to give.
    first = _coordinator(
        run,
        p,
        placement,
        max_attempts=2 if crash is not None else 1,
        stall_secs=3600.0,
        backoff=(0.05, 0.05, 1.0),
        before_launch=[arm],
    )
    first_task = asyncio.create_task(first.run())
    for _ in range(400):  # until the first driver really works (or stopped itself)
        cur = first.current
        if cur is not None and (
            (pause is None and cur.first_step_ms is not None) or is_stopped(cur.pid)
        ):
            break
        if first_task.done() or (cur is not None and cur.first_step_ms and pause is None):
            break
        await asyncio.sleep(0.05)
    old = first.current
    paused = old is not None and old.alive and is_stopped(old.pid)
    if not paused:
        await asyncio.sleep(delay)
    taking: list[Coordinator] = []
    second = asyncio.create_task(
        _drive(run, p, placement, schedule, kill_orphans=False, seen=taking)
    )
    if paused and old is not None:
        await _resume_after_takeover(old, taking, second, resume_s)
    second_result, injector = await second
    if old is not None and old.alive and is_stopped(old.pid):
        os.kill(old.pid, signal.SIGCONT)
    first_result = await first_task
    old_code = old.exit_code if old is not None else None
    second_start = min(
        (e["unix_ms"] for e in second_result.events if e.get("event") == "launch"), default=None
    )
    overlapped = bool(
        old is not None
        and old.ended_ms is not None
        and second_start is not None
        and old.ended_ms > second_start
    )
    if not overlapped:
        check = {"valid": True, "detail": f"old driver ended ({old_code}) before the takeover"}
    elif old_code == 75:
        check = {"valid": True, "detail": "old driver was fenced (exit 75)"}
    elif old_code == 0 and not paused:
        check = {"valid": True, "detail": "old driver finished before being fenced"}
    elif old_code not in (None, 0, 78):
        # e.g. halted (exit 1) because a Space fault hit its command: it stopped without
        # recording anything, which no_stale_writes and the workspace checks confirm.
        check = {"valid": True, "detail": f"old driver stopped (exit {old_code})"}
    else:
        check = {"valid": False, "detail": f"old driver exited {old_code} while superseded"}
    merged = CoordinatorResult(
        status=second_result.status,
        attempts=first_result.attempts + second_result.attempts,
        epochs=first_result.epochs + second_result.epochs,
        exit_codes=first_result.exit_codes + second_result.exit_codes,
        events=first_result.events + second_result.events,
        resumes=second_result.resumes,
        reason=second_result.reason,
    )
    extra = {
        "stale_check": check,
        "stale_overlapped": overlapped,
        "old_exit": old_code,
        "stale_pause": None
        if pause is None
        else {
            **pause.to_json(),
            "paused": paused,
            "after_crash": None if crash is None else crash.spec(),
        },
    }
    return merged, injector, extra


#: How often the old driver of a ``stale`` run is paused (else it simply runs on).
STALE_PAUSE_P = 0.7
#: Where the driver before a recovery-pausing old driver dies (the call's fate unknown).
CRASH_BEFORE_PAUSE = ("adapter.mid_call", "adapter.file_op", "adapter.start_mark")
#: Pause points on a resumer's path: the Space is being brought back to the log.
RECOVERY_PAUSE_POINTS = ("recovery.start", "image.apply_op", "snapshots.restore", "space.mutate")


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


async def trace_hits(run: RunSpec) -> list[tuple[str, int]]:
    """The failpoint hits of one uninterrupted run (for ``exhaustive``)."""
    await fresh_dirs(run)
    p = write_config(run)
    trace = p["root"] / "trace.txt"
    placement = Placement(run, p["spaces"])

    def arm_trace(launch: Launch) -> None:
        launch.env["DS_FAILPOINT_TRACE"] = str(trace)

    coordinator = _coordinator(run, p, placement, before_launch=[arm_trace])
    try:
        result = await coordinator.run()
        if result.status != "done":
            raise RuntimeError(f"the tracing run ended {result.status}: {result.reason}")
        return read_trace(trace)
    finally:
        await placement.delete()


def exhaustive_schedules(spec: CampaignSpec, work_dir: Path) -> list[Schedule]:
    """Every failpoint hit of one uninterrupted run of ``spec.seed_base``'s script, as one
    single-kill schedule each (the systematic alternative to random kills)."""
    run = RunSpec(
        run_id="trace",
        seed=spec.seed_base,
        mode="calm",
        backend=spec.backend,
        calls=spec.calls,
        durable_mode=spec.adapter_mode,
        state_dir=str(work_dir),
    )
    hits = asyncio.run(trace_hits(run))
    return exhaustive((f"{p} {n}" for p, n in hits if p in POINTS), spec.seed_base)


__all__ = ["POINTS", "exhaustive_schedules", "run_one", "trace_hits"]
