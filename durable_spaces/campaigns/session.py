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
import json
import random
import shutil
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from durable_spaces.adapter.models import ScriptedModel
from durable_spaces.backends import open_backend
from durable_spaces.campaigns.agent import AgentConfigFile
from durable_spaces.campaigns.checker import (
    History,
    check_all,
    load_history,
    snapshot_workspace,
)
from durable_spaces.campaigns.coordinator import Coordinator, CoordinatorResult, Launch
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.spec import CampaignSpec, RunSpec
from durable_spaces.chaos.schedule import AttemptPlan, Failpoint, Schedule, exhaustive

#: Failpoints a scripted call passes through (the campaign draws kills among these).
POINTS = (
    "adapter.call",
    "adapter.start_mark",
    "adapter.spawn",
    "adapter.running",
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
        # Stale runs need a driver still busy when the next one takes over.
        sleep=0.4 if run.mode == "stale" else _sleep_for(seed),
    ).save(p["session"])
    return p


class Faults:
    """Plays a schedule's faults against the coordinator and the backend, and counts."""

    def __init__(self, run: RunSpec, schedule: Schedule, spaces_dir: Path) -> None:
        self.run = run
        self.schedule = schedule
        self.backend = open_backend(run.backend, spaces_dir)
        self.counts: Counter[str] = Counter()
        self.log: list[dict[str, Any]] = []
        self.names: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    async def _names(self) -> list[str]:
        names = await self.backend.names()
        self.names.update(names)
        return sorted(self.names)

    async def inflict(self, kind: str) -> None:
        for name in await self._names():
            try:
                if kind == "daemon_kill":
                    await self.backend.kill_daemon(name)
                elif kind == "space_restart":
                    await self.backend.restart(name)
                elif kind == "space_remove":
                    await self.backend.delete(name)
                self.counts[kind] += 1
                self.log.append({"fault": kind, "space": name, "unix_ms": int(time.time() * 1000)})
            except Exception as e:  # a fault that could not be inflicted is recorded, not fatal
                self.log.append({"fault": kind, "error": repr(e)})

    def before_launch(self, launch: Launch) -> None:
        plan = self.schedule.plan(launch.index)
        launch.env.update(plan.env())
        if plan.failpoint is not None:
            self.counts["failpoint_armed"] += 1

    async def after_kill(self, index: int) -> None:
        """Triggered faults of attempt ``index`` once its driver died."""
        for f in self.schedule.plan(index).faults:
            if f.trigger == "after_kill":
                await self.inflict(f.kind)

    def start(self, coordinator: Coordinator) -> None:
        attempts = coordinator.attempts()

        async def follow() -> None:
            async for a in attempts:
                plan = self.schedule.plan(a.index)
                if not plan.empty:
                    self._tasks.append(asyncio.create_task(self._play(coordinator, a, plan)))

        self._tasks.append(asyncio.create_task(follow()))

    async def _play(self, coordinator: Coordinator, a: Any, plan: AttemptPlan) -> None:
        timed = [(t, "kill") for t in plan.kill_after_s] + [
            (f.at_s, f.kind) for f in plan.faults if f.at_s is not None
        ]
        start = time.monotonic()
        for at, what in sorted(timed):
            await asyncio.sleep(max(0.0, at - (time.monotonic() - start)))
            if not a.alive:
                break
            if what == "kill":
                if coordinator.kill_current("nemesis") is not None:
                    self.counts["random_kill"] += 1
            else:
                await self.inflict(what)
        if any(f.trigger == "after_kill" for f in plan.faults):
            code = await a.wait()
            if code not in (0, 75, 78):
                await self.after_kill(a.index)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def place_space(self) -> None:
        """The coordinator's placement: a Space that was removed is created again (empty;
        the adapter rebuilds it from the log or the store)."""
        for name in sorted(self.names):
            if await self.backend.find(name) is None:
                await self.backend.create(name)
                self.counts["placed"] += 1


def _coordinator(run: RunSpec, p: dict[str, Path], faults: Faults, **kw: Any) -> Coordinator:
    return Coordinator(
        AGENT_ARGV,
        p["session"],
        run.run_id,
        stall_secs=60.0,
        heartbeat_secs=2.0,
        backoff=(0.05, 0.4, 2.0),
        max_attempts=kw.pop("max_attempts", 24),
        place_space=faults.place_space,
        before_launch=[faults.before_launch],
        timeout_secs=RUN_TIMEOUT_S,
        **kw,
    )


def same_as_uninterrupted(history: History, seed: str, calls: int) -> dict[str, Any]:
    """A run with no interrupted call asked for exactly the calls of an uninterrupted run."""
    if any(r.get("status") == "interrupted" for r in history.results):
        return {"valid": True, "detail": "has interrupted calls: not comparable"}
    model = ScriptedModel(seed, calls)
    files: dict[str, str] = {}
    want = []
    for step in range(calls):
        tc = model.call(step, files)
        want.append(tc.id)
        _apply(files, tc.name, tc.args)
    got = [r.get("call_id") for r in history.results]
    if got == want:
        return {"valid": True, "detail": f"{len(got)} calls as uninterrupted"}
    return {"valid": False, "detail": f"calls {got} != uninterrupted {want}"}


def _apply(files: dict[str, str], name: str, args: Mapping[str, Any]) -> None:
    from durable_spaces.campaigns.checker import interpret_append

    if name == "write":
        files[args["path"]] = args["content"]
    elif name == "edit":
        files[args["path"]] = files[args["path"]].replace(args["old_text"], args["new_text"], 1)
    elif name == "bash" and (parsed := interpret_append(args["command"])):
        files[parsed[0]] = files.get(parsed[0], "") + parsed[1] + "\n"


async def _check(run: RunSpec, p: dict[str, Path], faults: Faults) -> dict[str, Any]:
    log = p["session"] / "log.sqlite"
    if not log.exists():
        return {"log": {"valid": None, "detail": "no log was written"}}
    history = load_history(str(log))
    names = await faults._names()
    if len(names) != 1:
        return {"space": {"valid": None, "detail": f"expected one Space, found {names}"}}
    space = await faults.backend.find(names[0])
    if space is None:
        return {"space": {"valid": False, "detail": f"Space {names[0]} is gone after the run"}}
    workspace = await snapshot_workspace(space)
    verdicts: dict[str, Any] = dict(check_all(history, workspace))
    verdicts["same_as_uninterrupted"] = same_as_uninterrupted(history, model_seed(run), run.calls)
    if any(v.get("valid") is not True for v in verdicts.values()):
        (p["root"] / "workspace.json").write_text(
            json.dumps({k: v.decode(errors="replace") for k, v in workspace.items()}, indent=1)
        )
    return verdicts


async def run_one(run: RunSpec) -> RunRecord:
    """Run, check and clean up one campaign run."""
    t0 = time.monotonic()
    await fresh_dirs(run)
    p = write_config(run)
    if run.schedule is not None:
        schedule = run.schedule
    elif run.mode == "exhaustive":
        schedule = exhaustive_schedule(run)
    else:
        schedule = Schedule.draw(run.seed, POINTS, run.calls, run.profile)
    faults = Faults(run, schedule, p["spaces"])
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
            result, extra = await _drive_stale(run, p, faults)
            record.extra.update(extra)
        else:
            coordinator = _coordinator(run, p, faults)
            faults.start(coordinator)
            try:
                result = await coordinator.run()
            finally:
                await faults.stop()
        _fill(record, result, faults)
        record.checks = await _check(run, p, faults)  # type: ignore[assignment]
        if run.mode == "stale":
            record.checks["stale_driver_fenced"] = record.extra.pop("stale_check")
        if result.status != "done":
            record.checks["coordinator"] = {
                "valid": False,
                "detail": f"session ended {result.status}: {result.reason}",
            }
        record.settle()
    except Exception as e:
        record.outcome = "error"
        record.checks = {"run": {"valid": None, "detail": f"{type(e).__name__}: {e}"}}
    finally:
        with contextlib.suppress(Exception):
            for name in await faults._names():
                await faults.backend.delete(name)
        with contextlib.suppress(Exception):
            await faults.backend.close()
        record.duration_s = round(time.monotonic() - t0, 3)
    return record


def _fill(record: RunRecord, result: CoordinatorResult, faults: Faults) -> None:
    recoveries: Counter[str] = Counter()
    for ev in result.events:
        data = ev.get("data") or {}
        if ev.get("event") == "driver_event" and data.get("event") == "recovery":
            recoveries[str(data.get("kind"))] += 1
    crashed = sum(1 for c in result.exit_codes if c == -9)
    fault_counts = {k: v for k, v in faults.counts.items() if k not in ("failpoint_armed",)}
    # A driver that died of SIGKILL was either shot by the runner (random_kill) or killed
    # itself at an armed failpoint.
    fault_counts["failpoint"] = max(0, crashed - fault_counts.get("random_kill", 0))
    record.faults = dict(sorted((k, v) for k, v in fault_counts.items() if v))
    record.kills = crashed
    record.recoveries = dict(sorted(recoveries.items()))
    record.attempts = result.attempts
    record.resume_latencies_ms = [round(r.latency_ms, 1) for r in result.resumes]
    record.extra.update(
        epochs=result.epochs, exit_codes=result.exit_codes, status=result.status, faults=faults.log
    )


async def _drive_stale(
    run: RunSpec, p: dict[str, Path], faults: Faults
) -> tuple[CoordinatorResult, dict[str, Any]]:
    """A second coordinator takes over (a new epoch) while the first one's driver runs."""
    calm = Faults(run, Schedule(run.seed, (), "manual"), p["spaces"])
    first = _coordinator(run, p, calm, max_attempts=1)
    first_task = asyncio.create_task(first.run())
    delay = random.Random(f"{run.seed}:stale").uniform(0.0, 1.0)
    # Wait until the first driver really works, then a little longer.
    for _ in range(200):
        if first.current is not None and first.current.first_step_ms is not None:
            break
        if first_task.done():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(delay)
    old = first.current
    second = _coordinator(run, p, faults, kill_orphans=False)
    second_result = await second.run()
    first_result = await first_task
    old_code = old.exit_code if old is not None else None
    overlapped = (
        old is not None
        and old.ended_ms is not None
        and second.history
        and (old.ended_ms > second.history[0].started_ms)
    )
    if not overlapped:
        check = {"valid": True, "detail": f"old driver ended ({old_code}) before the takeover"}
    elif old_code in (75,):
        check = {"valid": True, "detail": "old driver was fenced (exit 75)"}
    elif old_code == 0:
        check = {"valid": True, "detail": "old driver finished before being fenced"}
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
    return merged, {
        "stale_check": check,
        "stale_overlapped": bool(overlapped),
        "old_exit": old_code,
    }


async def trace_hits(run: RunSpec) -> list[tuple[str, int]]:
    """The failpoint hits of one uninterrupted run (for ``exhaustive``)."""
    from durable_spaces.chaos.schedule import read_trace

    await fresh_dirs(run)
    p = write_config(run)
    trace = p["root"] / "trace.txt"
    faults = Faults(run, Schedule(run.seed, (), "manual"), p["spaces"])

    def arm_trace(launch: Launch) -> None:
        launch.env["DS_FAILPOINT_TRACE"] = str(trace)

    coordinator = _coordinator(run, p, faults)
    coordinator.before_launch.append(arm_trace)
    try:
        result = await coordinator.run()
        if result.status != "done":
            raise RuntimeError(f"the tracing run ended {result.status}: {result.reason}")
        return read_trace(trace)
    finally:
        for name in await faults._names():
            await faults.backend.delete(name)
        await faults.backend.close()


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
