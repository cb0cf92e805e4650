"""The ``durable-spaces`` command: campaigns, repros, reports.

``campaign`` and ``repro`` run sessions from ``durable_spaces.campaigns.run``
(``async def run_one(run: RunSpec) -> RunRecord``, and for ``--scenario exhaustive``
``exhaustive_schedules(spec: CampaignSpec, work_dir: Path) -> list[Schedule]``),
imported only when used so ``report`` works without any backend installed.
Options left out fall back to the ``CRASH_*`` variables, then to the defaults.

Bad input ends in one line, ``durable-spaces: error: <what>``, and exit 2 (a bad
argument, as click's own usage errors) or 1 (a failure to do what was asked), never a
traceback: ``_OneLineErrors`` flattens click's multi-line usage errors and turns the
package's typed errors into that line too.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from durable_spaces.campaigns.scenarios import known_scenarios
from durable_spaces.campaigns.spec import BACKENDS
from durable_spaces.errors import ConfigError, DurableSpacesError

SESSION_MODULE = "durable_spaces.campaigns.run"
#: A week: a run that needs longer is wedged (the default is 900 s).
MAX_RUN_TIMEOUT_S = 7 * 24 * 3600.0
#: Schedules are a few KB; a bigger (or endless, /dev/zero) file is not one.
MAX_SCHEDULE_BYTES = 16 << 20
_ENTRY = re.compile(r"e[1-9][0-9]{0,17}", re.ASCII)
_CONVERSATION = re.compile(r"c[1-9][0-9]{0,17}", re.ASCII)


#: click's exceptions as this typer raises them (newer typers vendor their own click).
_click_errors: Any = sys.modules[typer.BadParameter.__module__]


class _Never(Exception):
    """Stands in for click's NoArgsIsHelpError where click has none (before 8.2)."""


_NO_ARGS_IS_HELP: type[Exception] = getattr(_click_errors, "NoArgsIsHelpError", _Never)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class _OneLineErrors(TyperGroup):
    """Every error a user can cause as one ``durable-spaces: error: ...`` line."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS_IS_HELP as e:
            e.show()  # type: ignore[attr-defined]  # the help text itself, as before
            code = e.exit_code  # type: ignore[attr-defined]
        except _click_errors.ClickException as e:
            hint = " (see --help)" if isinstance(e, _click_errors.UsageError) else ""
            typer.echo(f"durable-spaces: error: {_one_line(e.format_message())}{hint}", err=True)
            code = e.exit_code
        except typer.Abort:
            typer.echo("durable-spaces: error: aborted", err=True)
            code = 1
        except (DurableSpacesError, OSError) as e:
            typer.echo(f"durable-spaces: error: {_one_line(str(e))}", err=True)
            code = 1
        else:
            code = rv if isinstance(rv, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)


app = typer.Typer(
    name="durable-spaces",
    help="Keep a Space consistent with its durable log; the chaos lab that proves it.",
    no_args_is_help=True,
    add_completion=False,
    cls=_OneLineErrors,
)


def _fail(msg: str, code: int = 2) -> typer.Exit:
    typer.echo(f"durable-spaces: error: {_one_line(msg)}", err=True)
    return typer.Exit(code)


def _usable_dir(option: str, path: Path) -> Path:
    """``path`` as an absolute directory we can write: made (with parents) if missing;
    ``_fail`` if it is a file, a dangling symlink, or cannot be made or written."""
    path = path.absolute()
    if path.exists() and not path.is_dir():
        raise _fail(f"{option} {path} exists and is not a directory")
    if path.is_symlink() and not path.exists():
        raise _fail(f"{option} {path} is a dangling symbolic link")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _fail(f"{option} {path} cannot be created: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise _fail(f"{option} {path} is not writable")
    return path


def _run_timeout(value: float) -> float:
    if not math.isfinite(value) or not 0 < value <= MAX_RUN_TIMEOUT_S:
        raise _fail(f"--run-timeout must be more than 0 and at most {MAX_RUN_TIMEOUT_S:g} s")
    return value


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


Mode = Annotated[str | None, typer.Option(
    help="CRASH_MODE: the adapter's mode (transactional, auto, checkpoint); stale, exhaustive "
         "and server are still taken, as aliases of --scenario")]  # fmt: skip
Scenario = Annotated[str | None, typer.Option(
    help=f"CRASH_SCENARIO: how runs are driven ({', '.join(known_scenarios())})")]  # fmt: skip
Backend = Annotated[str | None, typer.Option(
    help=f"CRASH_BACKEND: {', '.join(BACKENDS)}")]  # fmt: skip
DurableMode = Annotated[str | None, typer.Option(
    help="CRASH_DURABLE_MODE: the adapter's mode (an alias of --mode that wins over "
         "it)")]  # fmt: skip
Calls = Annotated[int | None, typer.Option(help="CRASH_CALLS: scripted calls per run")]
Profile = Annotated[str | None, typer.Option(help="fault profile (CRASH_PROFILE)")]
Keep = Annotated[bool, typer.Option(help="keep each run's workspace tar and raw log (CRASH_KEEP)")]


def _keep(keep: bool) -> None:
    """Runs read CRASH_KEEP (workers inherit this process's environment)."""
    if keep:
        os.environ["CRASH_KEEP"] = "1"


@app.command()
def campaign(
    mode: Mode = None,
    scenario: Scenario = None,
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
    keep: Keep = False,
    retries: Annotated[
        int, typer.Option(help="replay each failed run exactly this many times (0: never)")
    ] = 3,
    determinism: Annotated[
        int | None,
        typer.Option(help="instead: run K seeds twice each, report how many went the same way"),
    ] = None,
) -> None:
    """Run a crash campaign; SUMMARY is the last line; exit 1 if any run failed (3 if
    only the lab itself broke)."""
    from durable_spaces.campaigns.runner import run_campaign, run_determinism
    from durable_spaces.campaigns.spec import CampaignSpec

    try:
        spec = CampaignSpec.from_env(
            mode=mode, scenario=scenario, backend=backend, seed_base=seed_base, runs=runs,
            calls=calls, jobs=jobs, durable_mode=durable_mode, profile=profile,
        )  # fmt: skip
    except ConfigError as e:
        raise _fail(str(e)) from None
    run_timeout = _run_timeout(run_timeout)
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path("campaigns-out") / f"{spec.mode}-{spec.backend}-{spec.seed_base}-{stamp}"
    out = _usable_dir("--out", out)  # absolute: drivers refuse a relative state dir
    runs_dir = out / "runs"
    if runs_dir.is_symlink() or (runs_dir.exists() and not runs_dir.is_dir()):
        raise _fail(f"{runs_dir} is not a directory of run records")
    if runs_dir.is_dir() and any(runs_dir.iterdir()):
        if not force:
            raise _fail(f"{out} already holds runs (pass --force to replace them)")
        shutil.rmtree(runs_dir)
    if not 0 <= retries <= 100:
        raise _fail(f"--retries must be between 0 and 100, not {retries}")
    _keep(keep)
    session = _session()
    if determinism is not None:
        if spec.scenario == "exhaustive":
            raise _fail("--determinism draws seeds; exhaustive runs have no seeds to redraw")
        try:
            d = run_determinism(
                spec, f"{SESSION_MODULE}:run_one", determinism, out_dir=out,
                run_timeout_s=run_timeout,
            )  # fmt: skip
        except ConfigError as e:
            raise _fail(str(e)) from None
        raise typer.Exit(0 if d.same == d.seeds else 1)
    schedules = None
    if spec.scenario == "exhaustive":
        make = getattr(session, "exhaustive_schedules", None)
        if make is None:
            raise _fail(f"{SESSION_MODULE} has no exhaustive_schedules(spec, work_dir)")
        schedules = make(spec, out / "trace")
    result = run_campaign(
        spec, f"{SESSION_MODULE}:run_one", out_dir=out, schedules=schedules,
        run_timeout_s=run_timeout, shrink_failures=shrink, progress=progress, retries=retries,
    )  # fmt: skip
    if report:
        from durable_spaces.reports.render import render_report

        rep = render_report(out)
        typer.echo(f"report: {rep.markdown} {rep.html}", err=True)
    raise typer.Exit(result.exit_code)


@app.command()
def repro(
    seed: Annotated[str | None, typer.Option(help="the failed run's seed")] = None,
    exact: Annotated[
        Path | None,
        typer.Option(help="a run record (runs/<id>.json): replay its realized interleaving"),
    ] = None,
    tries: Annotated[int, typer.Option(help="with --exact: replay this many times")] = 1,
    mode: Mode = None,
    scenario: Scenario = None,
    backend: Backend = None,
    calls: Calls = None,
    durable_mode: DurableMode = None,
    profile: Profile = None,
    schedule: Annotated[Path | None, typer.Option(help="an explicit schedule JSON")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="where the run keeps its state")] = None,
    keep: Keep = False,
) -> None:
    """Run one campaign run alone, from its seed (and schedule), or exactly as a run
    record says it went (--exact); exit 1 if it fails."""
    from durable_spaces.campaigns.spec import CampaignSpec, RunSpec, check_seed
    from durable_spaces.chaos.schedule import Schedule

    if exact is not None:
        if seed is not None or schedule is not None:
            raise _fail("--exact replays a run record: give it alone, without --seed/--schedule")
        _keep(keep)
        raise typer.Exit(_repro_exact(exact, tries, state_dir))
    if seed is None:
        raise _fail("give --seed (a run's seed) or --exact (a run record)")
    try:
        check_seed("--seed", seed)
        cs = CampaignSpec.from_env(mode=mode, scenario=scenario, backend=backend, calls=calls,
                                   durable_mode=durable_mode, profile=profile, jobs=1)  # fmt: skip
    except ConfigError as e:
        raise _fail(str(e)) from None
    sched = None
    if schedule is not None:
        if not schedule.is_file() or schedule.stat().st_size > MAX_SCHEDULE_BYTES:
            raise _fail(f"--schedule {schedule} is not a schedule file (a JSON file)")
        try:
            sched = Schedule.load(schedule)
            check_seed("the schedule's seed", sched.seed)
        except (ConfigError, OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise _fail(f"--schedule {schedule} is not a schedule file: {e}") from None
    if state_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        state_dir = Path("campaigns-out") / "repro" / f"{seed}-{stamp}"
    state_dir = _usable_dir("--state-dir", state_dir)
    run = RunSpec(
        run_id="repro", seed=seed, mode=cs.mode, backend=cs.backend, calls=cs.calls,
        durable_mode=cs.adapter_mode, profile=cs.profile, state_dir=str(state_dir),
        schedule=sched, scenario=cs.scenario,
    )  # fmt: skip
    _keep(keep)
    session = _session()
    rec = asyncio.run(session.run_one(run))
    rec.save(state_dir)
    typer.echo(json.dumps(rec.to_json(), indent=2, sort_keys=True))
    failing = ",".join(rec.failing_checks()) or "-"
    typer.echo(f"RESULT seed={seed} outcome={rec.outcome} failing={failing}")
    raise typer.Exit(0 if rec.outcome == "ok" else 1)


def _repro_exact(path: Path, tries: int, state_dir: Path | None) -> int:
    from durable_spaces.campaigns.record import RunRecord
    from durable_spaces.campaigns.replay import differences, exact_spec, reproduction
    from durable_spaces.errors import RecordError

    if not 1 <= tries <= 100:
        raise _fail(f"--tries must be between 1 and 100, not {tries}")
    if not path.is_file():
        raise _fail(f"--exact {path} is not a run record file")
    try:
        original = RunRecord.load(path)
        if state_dir is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            state_dir = Path("campaigns-out") / "repro" / f"{original.run_id}-exact-{stamp}"
        state_dir = _usable_dir("--state-dir", state_dir)
        specs = [
            exact_spec(original, str(state_dir / f"try-{k}"), run_id=f"exact-{k}")
            for k in range(1, tries + 1)
        ]
    except (RecordError, ConfigError, ValueError, KeyError, TypeError) as e:
        raise _fail(f"--exact {path}: {e}") from None
    session = _session()
    replays = []
    for spec in specs:
        Path(spec.state_dir).mkdir(parents=True, exist_ok=True)
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


@app.command("report")
def report_cmd(directory: Annotated[Path, typer.Argument(help="a campaign directory")]) -> None:
    """Write report.md and report.html (tables and plots) into a campaign directory.
    A run record that cannot be read is skipped with a warning line naming it."""
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is not a directory"
        raise _fail(f"{directory} {what}; give a campaign directory (one with runs/)")
    if directory.joinpath("runs").is_symlink() or not (directory / "runs").is_dir():
        raise _fail(f"{directory} is not a campaign directory (no runs/ directory)")
    from durable_spaces.reports.render import render_report

    rep = render_report(directory)
    for path, why in rep.skipped:
        typer.echo(f"durable-spaces: warning: skipped {path}: {_one_line(why)}", err=True)
    if rep.skipped:
        n = len(rep.skipped)
        typer.echo(f"durable-spaces: warning: skipped {n} of {n + rep.runs} run records", err=True)
    typer.echo(str(rep.markdown))
    typer.echo(str(rep.html))


@app.command("check")
def check_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run's directory kept with --keep")],
) -> None:
    """Re-run the checker offline on a kept run; exit 1 if a check is not valid."""
    from durable_spaces.campaigns.checker import check_all, merge
    from durable_spaces.campaigns.checks.kept import load
    from durable_spaces.errors import DurableSpacesError

    try:
        verdicts = check_all(load(run_dir))
    except (DurableSpacesError, OSError) as e:
        raise _fail(str(e)) from None
    typer.echo(json.dumps(verdicts, indent=2, sort_keys=True))
    valid = merge(verdicts)
    failing = ",".join(sorted(k for k, v in verdicts.items() if v["valid"] is not True)) or "-"
    typer.echo(f"CHECK {run_dir} valid={valid} failing={failing}")
    raise typer.Exit(0 if valid is True else 1)


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

    for what, eid in (("ENTRY_A", entry_a), ("ENTRY_B", entry_b)):
        if not _ENTRY.fullmatch(eid):
            raise _fail(f"{what} must be an entry id like e12, got {eid!r}")
    if conversation is not None and not _CONVERSATION.fullmatch(conversation):
        raise _fail(f"--conversation must be a conversation id like c1, got {conversation!r}")
    if not state_dir.is_dir():
        raise _fail(f"STATE_DIR {state_dir} is not a directory")
    log = state_dir / "log.sqlite"
    if log.is_symlink() or not log.is_file():
        raise _fail(f"STATE_DIR {state_dir} holds no log (log.sqlite)")
    for option, d in (("--backend-dir", backend_dir), ("--store", store)):
        if d is not None and not d.is_dir():  # opening a backend would create it
            raise _fail(f"{option} {d} is not a directory")
    if backend is not None and backend not in BACKENDS:
        raise _fail(f"--backend={backend!r} is not one of: {', '.join(BACKENDS)}")
    try:
        text = review_diff_main(
            state_dir, backend, backend_dir, entry_a, entry_b,
            store_dir=store, conversation_id=conversation,
        )  # fmt: skip
    except (DurableSpacesError, OSError, KeyError) as e:
        raise _fail(str(e), 1) from None
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
