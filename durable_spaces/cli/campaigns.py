"""``campaign``, ``repro`` and ``agent``: running the lab's sessions.

``campaign`` and ``repro`` run sessions from ``durable_spaces.campaigns.run``
(``async def run_one(run: RunSpec) -> RunRecord``, and for ``--scenario exhaustive``
``exhaustive_schedules(spec: CampaignSpec, work_dir: Path) -> list[Schedule]``),
imported only when used so ``report`` works without any backend installed.
Options left out fall back to the ``CRASH_*`` variables, then to the defaults.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import os
import shutil
import time
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

from durable_spaces.campaigns.scenarios import known_scenarios
from durable_spaces.campaigns.spec import BACKENDS
from durable_spaces.cli.app import app, fail, usable_dir
from durable_spaces.errors import ConfigError, DurableSpacesError
from durable_spaces.host.bounded import load_json, load_object

SESSION_MODULE = "durable_spaces.campaigns.run"
#: A week: a run that needs longer is wedged (the default is 900 s).
MAX_RUN_TIMEOUT_S = 7 * 24 * 3600.0


def _run_timeout(value: float) -> float:
    if not math.isfinite(value) or not 0 < value <= MAX_RUN_TIMEOUT_S:
        raise fail(f"--run-timeout must be more than 0 and at most {MAX_RUN_TIMEOUT_S:g} s")
    return value


def _session() -> ModuleType:
    try:
        return importlib.import_module(SESSION_MODULE)
    except ModuleNotFoundError as e:
        if e.name == SESSION_MODULE:
            raise fail(
                f"the campaign session ({SESSION_MODULE}) is not part of this build yet; "
                "campaign and repro need it"
            ) from None
        raise


ModeOption = Annotated[str | None, typer.Option(
    help="CRASH_MODE: the adapter's mode (transactional, auto, checkpoint); stale, exhaustive "
         "and server are still taken, as aliases of --scenario")]  # fmt: skip
ScenarioOption = Annotated[str | None, typer.Option(
    help=f"CRASH_SCENARIO: how runs are driven ({', '.join(known_scenarios())})")]  # fmt: skip
Backend = Annotated[str | None, typer.Option(
    help=f"CRASH_BACKEND: {', '.join(BACKENDS)}")]  # fmt: skip
DurableMode = Annotated[str | None, typer.Option(
    help="CRASH_DURABLE_MODE: the adapter's mode (an alias of --mode that wins over "
         "it)")]  # fmt: skip
Calls = Annotated[int | None, typer.Option(help="CRASH_CALLS: scripted calls per run")]
ProfileOption = Annotated[str | None, typer.Option(help="fault profile (CRASH_PROFILE)")]
Keep = Annotated[bool, typer.Option(help="keep each run's workspace tar and raw log (CRASH_KEEP)")]


def _check_behaviour_env() -> None:
    """This process's ``DS_*`` that choose code paths (what its runs' drivers inherit),
    checked as a run record's are (``spec.check_env``): ``DS_MUTANTS=nope`` is one line."""
    from durable_spaces.campaigns.spec import behaviour_env, check_env

    check_env(behaviour_env(), "the environment")


def _zygote_on() -> bool:
    """Whether this process's runs get the campaign's zygote (``drive/zygote.py``): the
    lab's ``DS_ZYGOTE`` and the product's ``DS_WARM_DRIVERS``, as this process has them
    now (``repro --exact`` took a record's)."""
    from durable_spaces.campaigns.spec import LabSettings
    from durable_spaces.settings import Settings

    return bool(LabSettings.from_env().zygote and Settings.from_env().warm_drivers)


def _keep(keep: bool) -> None:
    """Runs read CRASH_KEEP (workers inherit this process's environment)."""
    if keep:
        os.environ["CRASH_KEEP"] = "1"


@app.command()
def campaign(
    mode: ModeOption = None,
    scenario: ScenarioOption = None,
    backend: Backend = None,
    seed_base: Annotated[str | None, typer.Option(help="CRASH_SEED_BASE")] = None,
    runs: Annotated[int | None, typer.Option(help="CRASH_RUNS")] = None,
    calls: Calls = None,
    jobs: Annotated[int | None, typer.Option(help="CRASH_JOBS: runs in parallel")] = None,
    durable_mode: DurableMode = None,
    profile: ProfileOption = None,
    out: Annotated[Path | None, typer.Option(help="campaign directory")] = None,
    force: Annotated[bool, typer.Option(help="reuse a non-empty --out")] = False,
    shrink: Annotated[bool, typer.Option(help="shrink every failed run")] = False,
    run_timeout: Annotated[float, typer.Option(help="seconds before a run is killed")] = 900.0,
    report: Annotated[bool, typer.Option(help="write report.md/html at the end")] = True,
    progress: Annotated[bool, typer.Option(help="live progress bar on stderr")] = True,
    keep: Keep = False,
    retries: Annotated[
        int, typer.Option(help="replay each failed run exactly this many times (0: never)")
    ] = 3,
    determinism: Annotated[
        int | None,
        typer.Option(help="instead: run K seeds twice each, report how many went the same way"),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option("--db", help="run on the cluster's queue (workers anywhere): its libpq URL"),
    ] = None,
) -> None:
    """Run a crash campaign; SUMMARY is the last line; exit 1 if any run failed, 3 if
    only the lab itself broke, 4 if it tested less than it planned (docs/lab-exit-codes.md)."""
    from durable_spaces.campaigns.determinism import run_determinism
    from durable_spaces.campaigns.runner import run_campaign
    from durable_spaces.campaigns.spec import CampaignSpec

    try:
        spec = CampaignSpec.from_env(
            mode=mode, scenario=scenario, backend=backend, seed_base=seed_base, runs=runs,
            calls=calls, jobs=jobs, durable_mode=durable_mode, profile=profile,
        )  # fmt: skip
        _check_behaviour_env()
    except ConfigError as e:
        raise fail(str(e)) from None
    run_timeout = _run_timeout(run_timeout)
    if db is not None and determinism is not None:
        raise fail("--db and --determinism: the determinism check runs here, not queued")
    if db is not None and spec.scenario == "redrive":
        raise fail("--db: a redrive run brings its own cluster; run it without the queue")
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path("campaigns-out") / f"{spec.mode}-{spec.backend}-{spec.seed_base}-{stamp}"
    out = usable_dir("--out", out)  # absolute: drivers refuse a relative state dir
    runs_dir = out / "runs"
    if runs_dir.is_symlink() or (runs_dir.exists() and not runs_dir.is_dir()):
        raise fail(f"{runs_dir} is not a directory of run records")
    if runs_dir.is_dir() and any(runs_dir.iterdir()):
        if not force:
            raise fail(f"{out} already holds runs (pass --force to replace them)")
        shutil.rmtree(runs_dir)
    if not 0 <= retries <= 100:
        raise fail(f"--retries must be between 0 and 100, not {retries}")
    _keep(keep)
    from durable_spaces.campaigns.bytecode import notice

    if (line := notice()) is not None:
        typer.echo(line, err=True)
    session = _session()
    if determinism is not None:
        if spec.scenario == "exhaustive":
            raise fail("--determinism draws seeds; exhaustive runs have no seeds to redraw")
        try:
            d = run_determinism(
                spec, f"{SESSION_MODULE}:run_one", determinism, out_dir=out,
                run_timeout_s=run_timeout,
            )  # fmt: skip
        except ConfigError as e:
            raise fail(str(e)) from None
        raise typer.Exit(d.exit_code)
    schedules = plan = None
    if spec.scenario == "exhaustive":
        make = getattr(session, "exhaustive_schedules", None)
        if make is None:
            raise fail(f"{SESSION_MODULE} has no exhaustive_schedules(spec, work_dir)")
        schedules = make(spec, out / "trace")
        plan = _plan(out / "trace")
    executor = None
    if db is not None:
        from durable_spaces.campaigns.cluster.campaign_queue import QueuedRuns, campaign_name

        try:
            executor = QueuedRuns(db, campaign_name(out.name, time.time()),
                                  run_timeout_s=run_timeout)  # fmt: skip
        except DurableSpacesError as e:
            raise fail(str(e), 1) from None
        typer.echo(f"campaign {executor.campaign}: runs queued for workers", err=True)
    try:
        result = run_campaign(
            spec, f"{SESSION_MODULE}:run_one", out_dir=out, schedules=schedules,
            run_timeout_s=run_timeout, shrink_failures=shrink, progress=progress,
            retries=retries, executor=executor, plan=plan,
        )  # fmt: skip
    finally:
        if executor is not None:
            executor.close()
    if report:
        from durable_spaces.reports.render import render_report

        rep = render_report(out)
        typer.echo(f"report: {rep.markdown} {rep.html}", err=True)
    raise typer.Exit(result.exit_code)


def _plan(work_dir: Path) -> dict[str, object] | None:
    """What the exhaustive campaign's uninterrupted run passed (its session wrote it beside
    the trace; a session that did not leaves the coverage line without it)."""
    from durable_spaces.campaigns.scenarios.exhaustive import PLAN

    try:
        return load_object(work_dir / PLAN)
    except FileNotFoundError:
        return None


def _record_kind(path: Path) -> str | None:
    """The ``kind`` a run record names (a probe's says ``probe``; a campaign's none)."""
    from durable_spaces.campaigns.record import MAX_RECORD_BYTES

    try:  # a file that is not a record is left to the campaign's reader to name
        data = load_json(path, max_bytes=MAX_RECORD_BYTES)
    except (OSError, ValueError):
        return None
    return data.get("kind") if isinstance(data, dict) else None


@app.command()
def repro(
    record: Annotated[
        Path | None,
        typer.Argument(help="a run record to replay: a probe run's, or a campaign's as --exact"),
    ] = None,
    seed: Annotated[str | None, typer.Option(help="the failed run's seed")] = None,
    exact: Annotated[
        Path | None,
        typer.Option(help="a run record (runs/<id>.json): replay its realized interleaving"),
    ] = None,
    tries: Annotated[int, typer.Option(help="with --exact: replay this many times")] = 1,
    mode: ModeOption = None,
    scenario: ScenarioOption = None,
    backend: Backend = None,
    calls: Calls = None,
    durable_mode: DurableMode = None,
    profile: ProfileOption = None,
    schedule: Annotated[Path | None, typer.Option(help="an explicit schedule JSON")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="where the run keeps its state")] = None,
    keep: Keep = False,
) -> None:
    """Run one campaign run alone, from its seed (and schedule), or exactly as a run
    record says it went (--exact); exit 1 if it fails."""
    from durable_spaces.campaigns.spec import CampaignSpec, RunSpec, check_seed
    from durable_spaces.chaos.schedule import Schedule

    if record is not None:
        if exact is not None:
            raise fail("give the run record once (as an argument or as --exact)")
        exact = record
    if exact is not None and _record_kind(exact) == "probe":
        from durable_spaces.cli.probe import repro_probe

        raise typer.Exit(repro_probe(exact, state_dir))
    if exact is not None:
        if seed is not None or schedule is not None:
            raise fail("--exact replays a run record: give it alone, without --seed/--schedule")
        _keep(keep)
        raise typer.Exit(_repro_exact(exact, tries, state_dir))
    if seed is None:
        raise fail("give --seed (a run's seed) or --exact (a run record)")
    try:
        check_seed("--seed", seed)
        cs = CampaignSpec.from_env(mode=mode, scenario=scenario, backend=backend, calls=calls,
                                   durable_mode=durable_mode, profile=profile, jobs=1)  # fmt: skip
        _check_behaviour_env()
    except ConfigError as e:
        raise fail(str(e)) from None
    sched = None
    if schedule is not None:
        try:  # a FIFO, a device, /dev/zero or a directory is refused, never read
            sched = Schedule.load(schedule)
            check_seed("the schedule's seed", sched.seed)
        except (ConfigError, OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise fail(f"--schedule {schedule} is not a schedule file: {e}") from None
    if state_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        state_dir = Path("campaigns-out") / "repro" / f"{seed}-{stamp}"
    try:  # the schedule's bounds (a run's checks, as a record's: spec.check_schedule)
        run = RunSpec(
            run_id="repro", seed=seed, mode=cs.mode, backend=cs.backend, calls=cs.calls,
            durable_mode=cs.adapter_mode, profile=cs.profile, state_dir="",
            schedule=sched, scenario=cs.scenario,
        )  # fmt: skip
    except ConfigError as e:
        raise fail(f"--schedule {schedule}: {e}") from None
    state_dir = usable_dir("--state-dir", state_dir)
    run = run.with_(state_dir=str(state_dir))
    _keep(keep)
    session = _session()
    from durable_spaces.drive.zygote import serving

    with serving(os.environ, SESSION_MODULE, _zygote_on()):  # drivers as a campaign's are
        rec = asyncio.run(session.run_one(run))
    rec.save(state_dir)
    typer.echo(json.dumps(rec.to_json(), indent=2, sort_keys=True))
    failing = ",".join(rec.failing_checks()) or "-"
    typer.echo(f"RESULT seed={seed} outcome={rec.outcome} failing={failing}")
    raise typer.Exit(0 if rec.outcome == "ok" else 1)


def _repro_exact(path: Path, tries: int, state_dir: Path | None) -> int:
    from durable_spaces.campaigns.record import RunRecord
    from durable_spaces.campaigns.replay import (
        differences,
        exact_spec,
        recorded_env,
        reproduction,
        take_env,
    )
    from durable_spaces.errors import RecordError

    if not 1 <= tries <= 100:
        raise fail(f"--tries must be between 1 and 100, not {tries}")
    if not path.is_file():
        raise fail(f"--exact {path} is not a run record file")
    try:  # every check before anything is made (a record is checked as flags are)
        original = RunRecord.load(path)
        exact = exact_spec(original, "", run_id="exact-1")
        env = recorded_env(original)
    except (RecordError, ConfigError, ValueError, KeyError, TypeError) as e:
        raise fail(f"--exact {path}: {e}") from None
    if state_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        state_dir = Path("campaigns-out") / "repro" / f"{original.run_id}-exact-{stamp}"
    state_dir = usable_dir("--state-dir", state_dir)
    specs = [
        exact.with_(run_id=f"exact-{k}", state_dir=str(state_dir / f"try-{k}"))
        for k in range(1, tries + 1)
    ]
    if env is not None:  # the switches and mutants the run had, whatever this shell has
        take_env(env)
        shown = " ".join(f"{k}={v}" for k, v in env.items()) or "(none set)"
        typer.echo(f"environment of the record: {shown}", err=True)
    session = _session()
    replays = []
    from durable_spaces.drive.zygote import serving

    for spec in specs:
        Path(spec.state_dir).mkdir(parents=True, exist_ok=True)
        with serving(os.environ, SESSION_MODULE, _zygote_on()):  # as the campaign's drivers
            rec = asyncio.run(session.run_one(spec))
        rec.save(state_dir)
        replays.append(rec)
        diff = differences(original, rec)
        failing = ",".join(rec.failing_checks()) or "-"
        typer.echo(f"RESULT run={rec.run_id} outcome={rec.outcome} failing={failing} "
                   f"interleaving={'same' if not diff else 'different'}")  # fmt: skip
        for d in diff:
            typer.echo(f"  differs {d}")
    rep = reproduction(original, replays)
    typer.echo(rep.line())
    return 0 if all(r.outcome == "ok" for r in replays) else 1


@app.command()
def agent() -> None:
    """The campaign's scripted driver entry (a coordinator runs it once per attempt)."""
    from durable_spaces.campaigns.agent import main as agent_main

    raise typer.Exit(agent_main())
