"""One campaign run: a scripted session re-driven through faults, then checked.

``run_one(run)`` is what the runner calls per run (in a worker process). It does what
every run shares: fresh directories, the agent's configuration (``agent.json``), the
placement of the run's Space, a ``Coordinator`` re-driving ``python -m
durable_spaces.campaigns.agent`` with a new epoch per attempt and the nemesis composed to
play the schedule's faults against it (``RunContext.drive``), the check, the record, the
clean-up. How the run is driven and what else it must satisfy is its scenario's
(``campaigns/scenarios/``: ``random``, ``stale``, ``exhaustive``, ``server``).

When the session settles, every check of the run (``campaigns/evidence.py``) judges the
workspace against the committed log and what the lab saw, and the Spaces are deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_spaces.backends import open_backend
from durable_spaces.campaigns.agent import AgentConfigFile
from durable_spaces.campaigns.checker import LaunchRecord, Workload, collect
from durable_spaces.campaigns.checks.kept import keep
from durable_spaces.campaigns.checks.power import power_losses
from durable_spaces.campaigns.checks.verdict import Verdict
from durable_spaces.campaigns.evidence import Evidence, RunCheck, judge
from durable_spaces.campaigns.inject import Injector
from durable_spaces.campaigns.log_loss import LogHost
from durable_spaces.campaigns.power import HOST_DIR, PowerHost
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.scenarios import exhaustive
from durable_spaces.campaigns.scenarios.base import KILL_POINTS, Script, get
from durable_spaces.campaigns.spec import CampaignSpec, RunSpec, recorded_env
from durable_spaces.campaigns.trace_coverage import attempt_stories
from durable_spaces.chaos.journal_kill import JournalKiller
from durable_spaces.chaos.nemesis import (
    Composed,
    DiskStaller,
    DriverKiller,
    DriverPauser,
    LogLoss,
    Nemesis,
    PowerLoss,
    SpaceNemesis,
    compose,
)
from durable_spaces.chaos.profiles import profile_named
from durable_spaces.chaos.schedule import Schedule
from durable_spaces.drive.coordinator import Coordinator, CoordinatorResult
from durable_spaces.errors import SpaceUnavailableError
from durable_spaces.host.files import fsync_dir
from durable_spaces.space import space_name

#: The failpoints the campaign kills at (``scenarios.base.KILL_POINTS``).
POINTS = KILL_POINTS

AGENT_ARGV = (sys.executable, "-m", "durable_spaces.campaigns.agent")
#: What the campaign's zygote imports once for every spare it forks (drive/zygote.py).
DRIVER_MODULES = (AGENT_ARGV[2],)
#: ``1``: keep every run's checker inputs in ``<run>/kept`` (``durable-spaces ... --keep``).
KEEP_ENV = "CRASH_KEEP"
RUN_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class RunPaths:
    root: Path  # the run's state directory
    session: Path  # the coordinator's and the drivers' (the log, agent.json)
    spaces: Path  # the backend's
    store: Path  # the checkpoint store's


def _paths(run: RunSpec) -> RunPaths:
    root = Path(run.state_dir)
    prof = profile_named(run.profile)
    disk = root / HOST_DIR if prof.power else root  # campaigns/power.py
    session = root / HOST_DIR / "session" if prof.log_mount else disk / "session"
    return RunPaths(root, session, disk / "spaces", disk / "store")


def _host(run: RunSpec) -> PowerHost | None:
    """The run's host that can lose power, mounted (a ``power`` profile), or the log's
    own mount (a ``log-loss`` profile: ``campaigns/log_loss.py``), or None."""
    prof = profile_named(run.profile)
    if prof.log_mount:
        log = LogHost(
            Path(run.state_dir),
            run.seed,
            _paths(run).spaces,
            p_writeback=prof.p_log_writeback,
            p_tear=prof.p_tear,
            log_synchronous=prof.log_synchronous,
            log_format=prof.log_format,
        )
        log.start(["session"], off_host=["session/drivers"])
        return log
    if not prof.power:
        return None
    latency = prof.fsync_latency_ms
    host = PowerHost(
        Path(run.state_dir),
        run.seed,
        p_tear=prof.p_tear,
        log_synchronous=prof.log_synchronous,
        log_format=prof.log_format,
        # the disk's latency, drawn per run (from the seed: a replay gets the same)
        fsync_ms=round(random.Random(f"{run.seed}:fsync").uniform(*latency), 2) if latency else 0.0,
    )
    # the drivers' output (the coordinator's drivers/) is the lab's record: off the host
    host.start(["session", "spaces", "store"], off_host=["session/drivers"])
    return host


async def fresh_dirs(run: RunSpec) -> RunPaths:
    """A run starts from nothing: an earlier run's log, Spaces or checkpoints in the same
    directory would be resumed instead of tested."""
    p = _paths(run)
    if p.spaces.exists():
        backend = open_backend(run.backend, p.spaces)
        try:
            for name in await backend.names():
                await backend.delete(name)
        finally:
            await backend.close()
    for d in (p.session, p.spaces, p.store):
        shutil.rmtree(d, ignore_errors=True)
    return p


def write_config(run: RunSpec, script: Script) -> RunPaths:
    p = _paths(run)
    p.session.mkdir(parents=True, exist_ok=True)
    AgentConfigFile(
        backend=run.backend,
        backend_dir=str(p.spaces),
        mode=run.durable_mode,
        seed=script.seed,
        calls=run.calls,
        store_dir=str(p.store),
        # Machine checkpoints where the backend has them and checkpoint mode is asked for.
        snapshots="sandbox"
        if run.backend == "microvm" and run.durable_mode == "checkpoint"
        else "workspace",
        sleep=script.sleep,
        # Auto runs get a small file limit now and then, so the switch to checkpoint mode
        # happens mid-run (outcome and switch in one commit, then the checkpoint).
        max_files=random.Random(f"{script.seed}:limit").choice([2, 3, 4, None])
        if run.durable_mode == "auto"
        else None,
        server=script.server,
    ).save(p.session)
    return p


class Placement:
    """The coordinator's side of one run's Space: its fixed name (``CUA_SESSION_SPACE``),
    the backend handle the nemesis uses, and placing the Space again when it was lost."""

    def __init__(
        self, run: RunSpec, spaces_dir: Path, script: Script, host: PowerHost | None = None
    ) -> None:
        self.name = space_name(f"{run.run_id}/{script.seed}")
        self.backend = open_backend(run.backend, spaces_dir)
        # Its runtime (spacesd: the SDK's, slow to start) now, beside the first
        # driver's cold start, not at the first fault or placement after a kill (which
        # would count it in that resume).
        warm = getattr(type(self.backend), "warm_up", None)
        if callable(warm):
            threading.Thread(
                target=warm, args=(spaces_dir,), name="placement-warm-up", daemon=True
            ).start()
        self.placed = 0
        self.host = host

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
        if self.host is not None:
            self.host.stop()


def _nemesis(coordinator: Coordinator, placement: Placement) -> Composed:
    routes: dict[Any, Nemesis] = {
        "kill": DriverKiller(coordinator),
        "pause": DriverPauser(coordinator),
        ("daemon_kill", "space_restart", "space_remove", "space_pause"): SpaceNemesis(
            placement.backend, placement.name
        ),
    }
    routes["journal_kill"] = JournalKiller(placement.backend, placement.name)
    if placement.host is not None:  # before the injector's hooks: a launch waits for the host
        placement.host.attach(coordinator, placement.backend, placement.name)
        if isinstance(placement.host, LogHost):
            routes["log_loss"] = LogLoss(placement.host)
        else:
            routes["power_loss"] = PowerLoss(placement.host)
            routes["disk_stall"] = DiskStaller(placement.host, coordinator)
    return compose(routes)


class RunContext:
    """What a scenario drives one run with (``scenarios.base.Context``)."""

    def __init__(
        self, run: RunSpec, paths: RunPaths, placement: Placement, schedule: Schedule
    ) -> None:
        self.run = run
        self.paths = paths
        self.placement = placement
        self.schedule = schedule
        self.root = paths.root

    def coordinator(self, **kw: Any) -> Coordinator:
        c = self._coordinator(**kw)
        if self.placement.host is not None:  # every driver of the run on its host
            self.placement.host.host(c)
        return c

    def _coordinator(self, **kw: Any) -> Coordinator:
        return Coordinator(
            AGENT_ARGV,
            self.paths.session,
            self.run.run_id,
            stall_secs=kw.pop("stall_secs", 60.0),
            heartbeat_secs=2.0,
            backoff=kw.pop("backoff", (0.05, 0.4, 2.0)),
            max_attempts=kw.pop("max_attempts", 24),
            place_space=self.placement.place_space,
            env={"CUA_SESSION_SPACE": self.placement.name},
            timeout_secs=RUN_TIMEOUT_S,
            **kw,
        )

    async def drive(
        self,
        schedule: Schedule | None = None,
        *,
        seen: list[Coordinator] | None = None,
        **kw: Any,
    ) -> tuple[CoordinatorResult, Injector]:
        coordinator = self.coordinator(**kw)
        if seen is not None:
            seen.append(coordinator)
        traces = self.root / "traces" / coordinator.id[:8]
        injector = Injector(
            coordinator,
            self.schedule if schedule is None else schedule,
            _nemesis(coordinator, self.placement),
            traces,
        )
        inject = asyncio.create_task(injector.run())
        try:
            return await coordinator.run(), injector
        finally:
            inject.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await inject
            await injector.finish()  # every fault in flight lands whole before the check


def _workload(session_dir: Path) -> Workload:
    cfg = AgentConfigFile.load(session_dir)
    return Workload(seed=cfg.seed, calls=cfg.calls, sleep=cfg.sleep, server=cfg.server)


async def _check(
    ctx: RunContext,
    events: list[dict[str, Any]],
    result: CoordinatorResult,
    facts: dict[str, Any],
    checks: dict[str, RunCheck],
) -> dict[str, Any]:
    """Every check of the run (``evidence.judge``) on the raw log, the raw workspace,
    the launch history ``events`` and what the lab saw; the checker's inputs are kept in
    ``<run>/kept`` when ``CRASH_KEEP=1`` (the CLI's ``--keep``) or a check is not valid."""
    placement = ctx.placement
    ev = Evidence(placement.name, None, result.status, result.reason, facts=facts)
    log = ctx.paths.session / "log.sqlite"
    if not log.exists() and (ctx.paths.session / "log.jsonl").exists():
        log = ctx.paths.session / "log.jsonl"  # DS_LOG_FORMAT=jsonl (a power-jsonl profile)
    if not log.exists():
        ev.missing = "no log was written"
    else:
        workload = _workload(ctx.paths.session)
        launches = LaunchRecord.from_events(events)
        # A fault inflicted just as the run ended (a machine restart in flight) may still
        # be settling: read the workspace once the Space answers again.
        for attempt in range(6):
            space = await placement.backend.find(placement.name)
            ev.space_present = space is not None
            if space is None:
                ev.missing = f"Space {placement.name} is gone after the run"
                break
            try:
                ev.inputs = await collect(
                    space, log, workload=workload, launches=launches, store=ctx.paths.store
                )
                break
            except SpaceUnavailableError:
                if attempt == 5:
                    raise
                await asyncio.sleep(0.5 * (attempt + 1))
    verdicts = judge(ev, checks)
    wanted = os.environ.get(KEEP_ENV) == "1"
    if ev.inputs is not None and (wanted or any(v["valid"] is not True for v in verdicts.values())):
        keep(ctx.root, ev.inputs)
    return verdicts


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
    power_kills = sum(  # a power loss kills the drivers too: not a failpoint's death
        bool((op.value or {}).get("killed")) + len((op.value or {}).get("killed_stale") or ())
        for op in injector.nemesis.history
        if op.kind in ("power_loss", "log_loss") and op.type == "ok"
    )
    faults.pop("kill", None)
    faults["random_kill"] = random_kills
    faults["failpoint"] = max(0, got.kills - random_kills - power_kills)
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
        trace=attempt_stories(result.attempts, result.epochs, result.exit_codes, injector.trace_of),
    )


async def _space_missing(placement: Placement) -> dict[str, str] | None:
    """What the run's Space said it cannot do on this host, with why
    (``Capabilities.missing``: a local Space without cgroups fences its epochs by its
    process groups and environment mark alone); None when it could not be asked."""
    try:
        space = await placement.backend.find(placement.name)
        if space is None:
            return None
        return dict((await space.capabilities()).missing)
    except SpaceUnavailableError:
        return None


def _power_check(host: PowerHost) -> RunCheck:
    def check(ev: Evidence) -> Verdict:
        return power_losses(host.cuts, host.log_synchronous, host.log_format)

    return check


async def _prepare(run: RunSpec, script: Script, schedule: Schedule) -> RunContext:
    """Fresh directories, the agent's configuration, the Space's placement."""
    await fresh_dirs(run)
    host = _host(run)
    paths = write_config(run, script)
    if host is not None:  # agent.json durable too: it is the lab's, not under test
        fd = os.open(paths.session / "agent.json", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(paths.session)
    return RunContext(run, paths, Placement(run, paths.spaces, script, host), schedule)


async def run_one(run: RunSpec) -> RunRecord:
    """Run, check and clean up one campaign run."""
    t0 = time.monotonic()
    scenario = get(run.scenario)
    schedule = run.schedule if run.schedule is not None else scenario.schedule(run)
    record = RunRecord(
        run_id=run.run_id,
        seed=run.seed,
        mode=run.mode,
        backend=run.backend,
        calls=run.calls,
        schedule=schedule.to_json(),
        durable_mode=run.durable_mode,
        repro=run.repro(),
        scenario=run.scenario,
    )
    record.extra["profile"] = run.profile  # what repro --exact replays it with (replay.py)
    record.extra["env"] = recorded_env()  # and the whole configuration it ran with
    whole = getattr(scenario, "run_whole", None)
    if whole is not None:  # a scenario with a lab of its own (redrive: a whole cluster)
        filled: RunRecord = await whole(run, record)
        return filled
    ctx = await _prepare(run, scenario.script(run), schedule)
    try:
        result, injector, facts = await scenario.drive(run, ctx)
        record.extra.update(facts)
        _fill(record, result, injector)
        events = list(result.events)  # the launch history the checker reads
        placement = ctx.placement
        record.extra["space_missing"] = await _space_missing(placement)
        if result.status == "done" and await placement.backend.find(placement.name) is None:
            # A removal that landed as the last driver finished: what the next session
            # would do is drive once more, rebuilding the Space before it reports done.
            again, _ = await ctx.drive(Schedule(run.seed, (), "manual"))
            record.extra["redriven_after_late_removal"] = again.status
            events += again.events
        checks = dict(scenario.checks())
        host = ctx.placement.host
        if host is not None:
            record.extra["power"] = host.cuts
            record.extra["fsync_ms"] = host.fsync_ms
            checks["power_losses"] = _power_check(host)
        record.checks = await _check(ctx, events, result, facts, checks)
        record.settle()
    except Exception as e:
        record.outcome = "lab_error"
        record.checks = {"run": {"valid": None, "detail": f"{type(e).__name__}: {e}"}}
    finally:
        await ctx.placement.delete()
        if record.outcome == "ok":
            # A consistent run's log stays for the report; its Spaces' state (machine
            # checkpoints hold the guest's memory) and checkpoint store go.
            host = ctx.placement.host  # unmounted by now: its state is on the backing disk
            base = ctx.paths.root if host is None else host.disk
            for d in (base / "spaces", base / "store"):
                shutil.rmtree(d, ignore_errors=True)
        record.duration_s = round(time.monotonic() - t0, 3)
    return record


def exhaustive_schedules(spec: CampaignSpec, work_dir: Path) -> list[Schedule]:
    """Every failpoint hit of one uninterrupted run of ``spec.seed_base``'s script, as one
    single-kill schedule each (the systematic alternative to random kills)."""
    run = RunSpec(
        run_id="trace",
        seed=spec.seed_base,
        mode=spec.adapter_mode,
        backend=spec.backend,
        calls=spec.calls,
        durable_mode=spec.adapter_mode,
        state_dir=str(work_dir),
    )

    async def trace() -> list[tuple[str, int]]:
        calm = Schedule(run.seed, (), "manual")
        ctx = await _prepare(run, exhaustive.script_of(spec.seed_base), calm)
        try:
            return await exhaustive.trace_hits(ctx)
        finally:
            await ctx.placement.delete()

    hits = asyncio.run(trace())
    exhaustive.save_plan(work_dir, hits)  # what it passed: the campaign's coverage line
    return exhaustive.schedules(hits, spec.seed_base)


__all__ = ["POINTS", "RunContext", "exhaustive_schedules", "run_one"]
