"""The ``durable-spaces`` command: campaigns, repros, reports.

``campaign`` and ``repro`` run sessions from ``durable_spaces.campaigns.session``
(``async def run_one(run: RunSpec) -> RunRecord``, and for ``--mode exhaustive``
``exhaustive_schedules(spec: CampaignSpec, work_dir: Path) -> list[Schedule]``),
imported only when used so ``report`` works without any backend installed.
Options left out fall back to the ``CRASH_*`` variables, then to the defaults.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import shutil
import time
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

from durable_spaces.errors import ConfigError

SESSION_MODULE = "durable_spaces.campaigns.session"

app = typer.Typer(
    name="durable-spaces",
    help="Keep a Space consistent with its durable log; the chaos lab that proves it.",
    no_args_is_help=True,
    add_completion=False,
)


def _fail(msg: str, code: int = 2) -> typer.Exit:
    typer.echo(f"durable-spaces: {msg}", err=True)
    return typer.Exit(code)


def _session() -> ModuleType:
    try:
        return importlib.import_module(SESSION_MODULE)
    except ModuleNotFoundError as e:
        if e.name == SESSION_MODULE:
            raise _fail(
                f"the campaign session ({SESSION_MODULE}) is not part of this build yet; "
                "campaign and repro need it"
            ) from None
        raise


Mode = Annotated[str | None, typer.Option(help="CRASH_MODE: transactional, auto, checkpoint, "
                                          "stale, exhaustive, server")]  # fmt: skip
Backend = Annotated[str | None, typer.Option(help="CRASH_BACKEND: local, spacesd, docker, microvm")]
DurableMode = Annotated[str | None, typer.Option(help="CRASH_DURABLE_MODE: the adapter's mode")]
Calls = Annotated[int | None, typer.Option(help="CRASH_CALLS: scripted calls per run")]
Profile = Annotated[str | None, typer.Option(help="fault profile (CRASH_PROFILE)")]


@app.command()
def campaign(
    mode: Mode = None,
    backend: Backend = None,
    seed_base: Annotated[str | None, typer.Option(help="CRASH_SEED_BASE")] = None,
    runs: Annotated[int | None, typer.Option(help="CRASH_RUNS")] = None,
    calls: Calls = None,
    jobs: Annotated[int | None, typer.Option(help="CRASH_JOBS: runs in parallel")] = None,
    durable_mode: DurableMode = None,
    profile: Profile = None,
    out: Annotated[Path | None, typer.Option(help="campaign directory")] = None,
    force: Annotated[bool, typer.Option(help="reuse a non-empty --out")] = False,
    shrink: Annotated[bool, typer.Option(help="shrink every failed run")] = False,
    run_timeout: Annotated[float, typer.Option(help="seconds before a run is killed")] = 900.0,
    report: Annotated[bool, typer.Option(help="write report.md/html at the end")] = True,
    progress: Annotated[bool, typer.Option(help="live progress bar on stderr")] = True,
) -> None:
    """Run a crash campaign; SUMMARY is the last line; exit 1 if any run failed."""
    from durable_spaces.campaigns.runner import run_campaign
    from durable_spaces.campaigns.spec import CampaignSpec

    try:
        spec = CampaignSpec.from_env(
            mode=mode, backend=backend, seed_base=seed_base, runs=runs, calls=calls, jobs=jobs,
            durable_mode=durable_mode, profile=profile,
        )  # fmt: skip
    except ConfigError as e:
        raise _fail(str(e)) from None
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path("campaigns-out") / f"{spec.mode}-{spec.backend}-{spec.seed_base}-{stamp}"
    if (out / "runs").is_dir() and any((out / "runs").iterdir()):
        if not force:
            raise _fail(f"{out} already holds runs (pass --force to replace them)")
        shutil.rmtree(out / "runs")
    session = _session()
    schedules = None
    if spec.mode == "exhaustive":
        make = getattr(session, "exhaustive_schedules", None)
        if make is None:
            raise _fail(f"{SESSION_MODULE} has no exhaustive_schedules(spec, work_dir)")
        schedules = make(spec, out / "trace")
    result = run_campaign(
        spec, f"{SESSION_MODULE}:run_one", out_dir=out, schedules=schedules,
        run_timeout_s=run_timeout, shrink_failures=shrink, progress=progress,
    )  # fmt: skip
    if report:
        from durable_spaces.reports.render import render_report

        rep = render_report(out)
        typer.echo(f"report: {rep.markdown} {rep.html}", err=True)
    raise typer.Exit(result.exit_code)


@app.command()
def repro(
    seed: Annotated[str, typer.Option(help="the failed run's seed")],
    mode: Mode = None,
    backend: Backend = None,
    calls: Calls = None,
    durable_mode: DurableMode = None,
    profile: Profile = None,
    schedule: Annotated[Path | None, typer.Option(help="an explicit schedule JSON")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="where the run keeps its state")] = None,
) -> None:
    """Run one campaign run alone, from its seed (and schedule); exit 1 if it fails."""
    from durable_spaces.campaigns.spec import CampaignSpec, RunSpec
    from durable_spaces.chaos.schedule import Schedule

    try:
        cs = CampaignSpec.from_env(mode=mode, backend=backend, calls=calls,
                                   durable_mode=durable_mode, profile=profile, jobs=1)  # fmt: skip
        sched = Schedule.load(schedule) if schedule is not None else None
    except (ConfigError, OSError, ValueError, KeyError) as e:
        raise _fail(str(e)) from None
    if state_dir is None:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in seed)
        state_dir = Path("campaigns-out") / "repro" / f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"
    state_dir.mkdir(parents=True, exist_ok=True)
    run = RunSpec(
        run_id="repro", seed=seed, mode=cs.mode, backend=cs.backend, calls=cs.calls,
        durable_mode=cs.adapter_mode, profile=cs.profile, state_dir=str(state_dir),
        schedule=sched,
    )  # fmt: skip
    session = _session()
    rec = asyncio.run(session.run_one(run))
    rec.save(state_dir)
    typer.echo(json.dumps(rec.to_json(), indent=2, sort_keys=True))
    failing = ",".join(rec.failing_checks()) or "-"
    typer.echo(f"RESULT seed={seed} outcome={rec.outcome} failing={failing}")
    raise typer.Exit(0 if rec.outcome == "ok" else 1)


@app.command("report")
def report_cmd(directory: Annotated[Path, typer.Argument(help="a campaign directory")]) -> None:
    """Write report.md and report.html (tables and plots) into a campaign directory."""
    if not (directory / "runs").is_dir():
        raise _fail(f"{directory} is not a campaign directory (no runs/)")
    from durable_spaces.reports.render import render_report

    rep = render_report(directory)
    typer.echo(str(rep.markdown))
    typer.echo(str(rep.html))


@app.command()
def diff(
    state_dir: Annotated[Path, typer.Argument(help="a session's state directory (log.sqlite)")],
    entry_a: Annotated[str, typer.Argument(help="the earlier entry id, e.g. e12")],
    entry_b: Annotated[str, typer.Argument(help="the later entry id")],
    backend: Annotated[str | None, typer.Option(help="Space backend (default: agent.json)")] = None,
    backend_dir: Annotated[Path | None, typer.Option(help="the backend's state dir")] = None,
    store: Annotated[Path | None, typer.Option(help="a DirectoryCheckpointStore")] = None,
    conversation: Annotated[str | None, typer.Option(help="conversation id")] = None,
) -> None:
    """Show how the workspace differs between two entries of a session's log."""
    from durable_spaces.adapter.review import review_diff_main
    from durable_spaces.errors import DurableSpacesError

    try:
        text = review_diff_main(
            state_dir, backend, backend_dir, entry_a, entry_b,
            store_dir=store, conversation_id=conversation,
        )  # fmt: skip
    except (DurableSpacesError, OSError, KeyError) as e:
        raise _fail(str(e)) from None
    typer.echo(text)


@app.command()
def agent() -> None:
    """The campaign's scripted driver entry (a coordinator runs it once per attempt)."""
    from durable_spaces.campaigns.agent import main as agent_main

    raise typer.Exit(agent_main())


# --- the cluster: hosts, coordinators, submitting sessions ----------------------------------

Db = Annotated[
    str, typer.Option("--db", envvar="DS_CLUSTER_DB", help="the store's libpq URL")
]


def _cluster_errors() -> tuple[type[BaseException], ...]:
    from durable_spaces.errors import DurableSpacesError

    return (DurableSpacesError, OSError)


@app.command()
def host(
    db: Db,
    host_id: Annotated[str, typer.Option("--id", help="this host's id in the store")],
    address: Annotated[str, typer.Option(help="ip:port the host agent's API listens on")],
    backend: Annotated[str, typer.Option(help="spacesd, docker or local")] = "spacesd",
    state_dir: Annotated[Path | None, typer.Option(help="where its Spaces live")] = None,
    listen_host: Annotated[str | None, typer.Option(help="daemons' ip (default: address)")] = None,
    heartbeat_secs: Annotated[float, typer.Option(help="heartbeat interval")] = 1.0,
    sweep_secs: Annotated[float, typer.Option(help="how often Spaces are checked")] = 2.0,
) -> None:
    """Provide durable Spaces to the cluster from this machine."""
    from durable_spaces.cluster.commands import run_host

    try:
        run_host(
            db, host_id, address, backend, state_dir or Path(f"ds-host-{host_id}"),
            listen_host=listen_host, heartbeat_secs=heartbeat_secs, sweep_secs=sweep_secs,
        )  # fmt: skip
    except _cluster_errors() as e:
        raise _fail(str(e)) from None


@app.command()
def coordinator(
    db: Db,
    coordinator_id: Annotated[str, typer.Option("--id", help="this coordinator's id")],
    sessions_dir: Annotated[Path, typer.Option(help="the shared directory of session logs")],
    claim_ttl: Annotated[float, typer.Option(help="seconds a claim lasts unrenewed")] = 10.0,
    stall_secs: Annotated[float, typer.Option(help="driver silence before a kill")] = 60.0,
    backoff: Annotated[str, typer.Option(help="initial,max,factor seconds")] = "2,60,2",
    max_attempts: Annotated[int, typer.Option(help="drives per session at most")] = 20,
    max_sessions: Annotated[int, typer.Option(help="sessions driven at once")] = 4,
    lost_host_secs: Annotated[float, typer.Option(help="heartbeat age of a lost host")] = 5.0,
    driver: Annotated[str | None, typer.Option(help="driver command (default: agent)")] = None,
) -> None:
    """Claim durable sessions from the store and drive them (any number may run)."""
    from durable_spaces.cluster.commands import backoff_triple, driver_argv, run_coordinator
    from durable_spaces.cluster.drive import DriveSettings

    try:
        settings = DriveSettings(
            stall_secs=stall_secs, backoff=backoff_triple(backoff), max_attempts=max_attempts,
            claim_ttl=claim_ttl, max_sessions=max_sessions, lost_host_secs=lost_host_secs,
        )  # fmt: skip
        argv = driver_argv(driver)
        if argv is not None:
            settings.argv = argv
        run_coordinator(db, coordinator_id, sessions_dir, settings)
    except _cluster_errors() as e:
        raise _fail(str(e)) from None


@app.command()
def submit(
    db: Db,
    sessions_dir: Annotated[Path, typer.Option(help="the shared directory of session logs")],
    name: Annotated[str, typer.Option(help="the session's name")],
    space: Annotated[str | None, typer.Option(help="its durable Space (created if new)")] = None,
    seed: Annotated[str, typer.Option(help="the scripted agent's seed")] = "s1",
    calls: Annotated[int, typer.Option(help="scripted calls")] = 6,
    mode: Annotated[str, typer.Option(help="transactional, checkpoint or auto")] = "transactional",
    checkpoint_dir: Annotated[Path | None, typer.Option(help="a shared checkpoint store")] = None,
    wait: Annotated[float | None, typer.Option(help="wait up to this many seconds")] = None,
) -> None:
    """Submit a scripted durable session (the lab's agent) to the cluster."""
    from durable_spaces.cluster.commands import run_submit

    try:
        typer.echo(run_submit(
            db, sessions_dir, name, space=space, seed=seed, calls=calls, mode=mode,
            checkpoint_dir=checkpoint_dir, wait_secs=wait,
        ))  # fmt: skip
    except _cluster_errors() as e:
        raise _fail(str(e)) from None


@app.command()
def worker(
    db: Db,
    worker_id: Annotated[str, typer.Option("--id", help="this worker's id")],
    work_dir: Annotated[Path, typer.Option(help="where runs keep their state here")],
    campaign: Annotated[str | None, typer.Option(help="only this campaign's runs")] = None,
    claim_ttl: Annotated[float, typer.Option(help="seconds a run's claim lasts")] = 30.0,
    until_empty: Annotated[bool, typer.Option(help="stop once every run is done")] = False,
) -> None:
    """Pull campaign runs from the store's queue, run them, store their records."""
    from durable_spaces.cluster.commands import run_worker

    try:
        n = run_worker(
            db, worker_id, work_dir, campaign=campaign, claim_ttl=claim_ttl,
            until_empty=until_empty,
        )  # fmt: skip
    except _cluster_errors() as e:
        raise _fail(str(e)) from None
    typer.echo(f"{n} runs stored")


def main() -> None:  # pragma: no cover - console entry
    app(prog_name="durable-spaces")


if __name__ == "__main__":  # pragma: no cover
    main()
