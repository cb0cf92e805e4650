"""The campaign runner: many isolated runs in parallel, one record each, one SUMMARY.

Each run is a worker process of its own (``campaigns.worker``), at most ``jobs`` at a
time, with its own state directory under ``<out>/state/<run_id>``; a run that exceeds
``run_timeout_s`` is killed and recorded as ``lab_error``; each run's process is started
before the run, a spare (``campaigns/worker_spares.py``), unless ``DS_WARM_WORKERS=0``.
Layout of ``out_dir``::

    campaign.json         the spec, the run_one reference, times, the SUMMARY line
    runs/<run_id>.json    one RunRecord per run (what reports read)
    schedules/*.json      explicit schedules (exhaustive, shrunk) for --schedule
    logs/<run_id>.log     the worker's stdout and stderr
    state/<run_id>/       the run's own state (log, coordinator file, Space dirs)
    work/                 the RunSpec / RunRecord files passed to and from workers

Stdout gets, in order: one ``REPRO <run_id>: <command>`` line per failed run (the
seed's command and the exact replay of its record), a ``REPRODUCED <run_id> k/N`` line
per failed run replayed exactly ``retries`` times (``campaigns/replay.py``), a
``SHRUNK <run_id>: <command>`` line per shrunk one, an ``UNTESTED <reason>`` line when
the campaign tested less than it planned, then the SUMMARY line last. The progress bar
goes to stderr. ``CampaignResult.exit_code`` is 1 if any run failed, 3 if the only
trouble was the lab's own (``lab_error`` runs: the adapter was not judged), 4 if every
run was ok but the campaign ran none or its kills fell short of its scenario's tolerance
(``campaigns/earned.py``; docs/lab-exit-codes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from durable_spaces.campaigns import earned
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.replay import Reproduction, exact_spec, reproduction
from durable_spaces.campaigns.scenarios import registration
from durable_spaces.campaigns.shrink import ShrinkResult, shrink
from durable_spaces.campaigns.spec import MAX_JOBS, CampaignSpec, LabSettings, RunSpec
from durable_spaces.campaigns.summary import Summary, emit, scenario_fields
from durable_spaces.campaigns.trace_coverage import coverage_of, killed_at
from durable_spaces.campaigns.worker import error_record
from durable_spaces.campaigns.worker_spares import WorkerSpares
from durable_spaces.chaos.schedule import Schedule
from durable_spaces.drive import zygote
from durable_spaces.errors import ConfigError
from durable_spaces.settings import Settings

__all__ = ["CampaignResult", "CampaignSpec", "RunSpec", "run_campaign", "run_one_ref"]

RunOneRef = str | Callable[..., Any]


def run_one_ref(run_one: RunOneRef) -> str:
    """``module:qualname`` of a module-level function (what a worker process imports)."""
    if isinstance(run_one, str):
        return run_one
    mod, qual = getattr(run_one, "__module__", None), getattr(run_one, "__qualname__", "")
    if not mod or mod == "__main__" or "<" in qual:
        raise ValueError("run_one must be a module-level function importable by name")
    return f"{mod}:{qual}"


def _kill_tree(pid: int) -> None:
    """SIGKILL a worker and every process under it (its drivers run in sessions of their
    own, so killing the worker's process group alone would leave them running)."""
    try:
        procs = [*psutil.Process(pid).children(recursive=True), psutil.Process(pid)]
    except psutil.Error:
        procs = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DS_FAILPOINTS", "DS_FAILPOINT_TRACE")}
    # the parent's import path, as multiprocessing's spawn would pass it
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("CUA_TELEMETRY", "0")
    return env


@dataclass
class CampaignResult:
    spec: CampaignSpec
    out_dir: Path
    records: list[RunRecord]
    summary: Summary
    repros: dict[str, str] = field(default_factory=dict)
    shrunk: dict[str, ShrinkResult] = field(default_factory=dict)
    shrunk_repros: dict[str, str] = field(default_factory=dict)
    reproductions: dict[str, Reproduction] = field(default_factory=dict)
    #: Why the campaign tested less than it planned (``campaigns/earned.py``), or None.
    untested: str | None = None

    @property
    def failed(self) -> list[RunRecord]:
        """Every run that is not ok (failed, or the lab's own error)."""
        return [r for r in self.records if r.outcome != "ok"]

    @property
    def exit_code(self) -> int:
        """1 a run failed, 3 the lab broke one, 4 untested, 0 (``earned.exit_code``)."""
        return earned.exit_code(self.records, self.untested)

    @property
    def summary_line(self) -> str:
        return self.summary.line()


class RunExecutor(Protocol):
    """Where a campaign's runs run: ``_Runs`` (a process each, on this machine) by
    default; ``durable_spaces/campaigns/cluster/campaign_queue.py`` puts them on the cluster's queue
    for workers anywhere. Replays of failures and shrinking stay on this machine."""

    async def run(self, spec: RunSpec) -> RunRecord: ...


class _Runs:
    """Starts worker processes and collects their records."""

    def __init__(
        self, ref: str, out_dir: Path, run_timeout_s: float | None, lab: LabSettings
    ) -> None:
        self.ref = ref
        self.out = out_dir
        self.timeout = run_timeout_s
        #: The lab's settings, the campaign's (``CampaignSpec.lab``), put into ``env``.
        self.lab = lab
        self.env = {**_worker_env(), **lab.to_env()}
        #: The product's settings, read once here (a malformed one stops the campaign);
        #: the workers inherit them through ``env``.
        self.settings = Settings.from_env(self.env)
        #: The socket of the campaign's zygote while ``zygote()`` is open.
        self._zygote: str | None = None
        #: Spare workers (``campaigns/worker_spares.py``) while ``warm()`` is open.
        self.spares: WorkerSpares | None = None

    @contextlib.asynccontextmanager
    async def warm(self, jobs: int, runs: int) -> AsyncIterator[None]:
        """Keep ``jobs`` spare workers for the ``runs`` runs started inside (one event
        loop)."""
        if not self.lab.warm_workers or jobs < 1:
            yield
            return
        self.spares = WorkerSpares(self.ref, self.env, jobs, runs, self._zygote)
        self.spares.fill()
        try:
            yield
        finally:
            spares, self.spares = self.spares, None
            await spares.close()

    @contextlib.contextmanager
    def zygote(self) -> Iterator[zygote.CampaignZygote | None]:
        """The campaign's zygote (``drive/zygote.py``) for every run inside, the
        exact replays and shrinks included, so they start their drivers as the runs did
        (unless ``DS_ZYGOTE=0`` or ``DS_WARM_DRIVERS=0``)."""
        on = self.lab.zygote and self.settings.warm_drivers
        with zygote.serving(self.env, self.ref.split(":")[0], on) as z:
            self._zygote = z.address if z is not None else None
            try:
                yield z
            finally:
                self._zygote = None

    def _paths(self, spec: RunSpec, tag: str) -> tuple[Path, Path, Path]:
        work = self.out / "work"
        work.mkdir(parents=True, exist_ok=True)
        return (
            work / f"{spec.run_id}{tag}.spec.json",
            work / f"{spec.run_id}{tag}.record.json",
            self.out / "logs" / f"{spec.run_id}{tag}.log",
        )

    async def run(self, spec: RunSpec, tag: str = "") -> RunRecord:
        spec_path, rec_path, log_path = self._paths(spec, tag)
        spec_path.write_text(json.dumps(spec.to_json()))
        rec_path.unlink(missing_ok=True)
        Path(spec.state_dir).mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(log_path, "ab") as log:
            proc = None
            if self.spares is not None:
                proc = await self.spares.take(spec_path, rec_path, log_path)
            if proc is None:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "durable_spaces.campaigns.worker",
                    self.ref, str(spec_path), str(rec_path),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    env=self.env, start_new_session=True,
                )  # fmt: skip
            try:
                code = await asyncio.wait_for(proc.wait(), self.timeout)
            except (TimeoutError, asyncio.CancelledError) as e:
                _kill_tree(proc.pid)
                await proc.wait()
                if isinstance(e, asyncio.CancelledError):
                    raise
                return error_record(spec, f"run timed out after {self.timeout}s",
                                    time.monotonic() - t0)  # fmt: skip
        if not rec_path.exists():
            tail = log_path.read_text(errors="replace")[-1500:]
            return error_record(spec, f"worker exited {code} without a record:\n{tail}",
                                time.monotonic() - t0)  # fmt: skip
        return RunRecord.load(rec_path)

    def run_sync(self, spec: RunSpec, tag: str) -> RunRecord:
        return asyncio.run(self.run(spec, tag))


def _retry(runs: _Runs, rec: RunRecord, tries: int, state_root: str) -> Reproduction | None:
    """Replay a failed run exactly (its realized interleaving) ``tries`` times."""
    replays = []
    for k in range(1, tries + 1):
        rid = f"{rec.run_id}.exact{k}"
        try:
            spec = exact_spec(rec, os.path.join(state_root, rid), run_id=rid)
        except ConfigError:
            return None
        replays.append(runs.run_sync(spec, f".exact{k}"))
    return reproduction(rec, replays)


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("ok={task.fields[ok]} failed={task.fields[failed]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def _check_args(
    out_dir: str | Path, jobs: int | None, run_timeout_s: float | None, shrink_budget: int
) -> Path:
    """``out_dir`` made absolute (drivers refuse a relative state dir), or ``ConfigError``."""
    if jobs is not None and (type(jobs) is not int or not 1 <= jobs <= MAX_JOBS):
        raise ConfigError(f"jobs must be an integer in 1..{MAX_JOBS}, not {jobs!r}")
    if run_timeout_s is not None and (
        not isinstance(run_timeout_s, int | float) or not 0 < run_timeout_s < math.inf
    ):
        raise ConfigError(
            f"run_timeout_s must be a positive number of seconds or None, not {run_timeout_s!r}"
        )
    if type(shrink_budget) is not int or shrink_budget < 0:
        raise ConfigError(f"shrink_budget must be an integer >= 0, not {shrink_budget!r}")
    out = Path(out_dir).absolute()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out_dir {out} exists and is not a directory")
    return out


def run_campaign(
    spec: CampaignSpec,
    run_one: RunOneRef,
    *,
    out_dir: str | Path,
    jobs: int | None = None,
    schedules: Sequence[Schedule] | None = None,
    run_timeout_s: float | None = 900.0,
    shrink_failures: bool = False,
    shrink_budget: int = 40,
    progress: bool = True,
    stdout: IO[str] | None = None,
    retries: int = 3,
    executor: RunExecutor | None = None,
    plan: Mapping[str, Any] | None = None,
) -> CampaignResult:
    """Run the campaign; print REPRO/SHRUNK lines and the SUMMARY line to ``stdout``.

    ``run_one`` is a module-level ``async def run_one(run: RunSpec) -> RunRecord`` (or its
    ``"module:function"`` name). ``schedules`` given: one run per schedule (exhaustive
    mode), instead of ``spec.runs`` runs drawn from ``<seed_base>-<i>``; ``plan``: what
    their uninterrupted run passed (``scenarios/exhaustive.py``'s ``plan_of``), kept in
    ``campaign.json`` and held against where the kills landed (SUMMARY's ``killed_at``).
    Bad arguments raise ``ConfigError`` before anything is created.
    """
    out = _check_args(out_dir, jobs, run_timeout_s, shrink_budget)
    for sub in ("runs", "schedules", "logs", "state"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    ref = run_one_ref(run_one)
    jobs = jobs or spec.jobs
    started = time.time()
    meta: dict[str, Any] = {"spec": spec.to_json(), "run_one": ref, "jobs": jobs,
                            "started_unix": started}  # fmt: skip
    if plan is not None:
        meta["exhaustive"] = dict(plan)
    (out / "campaign.json").write_text(json.dumps(meta, indent=2) + "\n")

    state_root = str(out / "state")
    if schedules is not None:
        specs = [spec.run(i, state_root, s) for i, s in enumerate(schedules)]
    else:
        specs = [spec.run(i, state_root) for i in range(spec.runs)]
    sched_files: dict[str, str] = {}
    for rs in specs:
        if rs.schedule is not None:
            sched_files[rs.run_id] = str(rs.schedule.save(out / "schedules" / f"{rs.run_id}.json"))
    runs = _Runs(ref, out, run_timeout_s, spec.lab)
    first: RunExecutor = runs if executor is None else executor
    if executor is not None:
        jobs = len(specs) or 1  # all on the queue at once: the workers are the parallelism

    async def all_runs() -> list[RunRecord]:
        sem = asyncio.Semaphore(jobs)
        counts = {"ok": 0, "failed": 0}
        with _progress(progress) as bar:
            task = bar.add_task(f"{spec.mode}/{spec.backend}", total=len(specs), ok=0, failed=0)

            async def one(rs: RunSpec) -> RunRecord:
                async with sem:
                    rec = await first.run(rs)
                if not rec.repro:
                    rec.repro = rs.repro(sched_files.get(rs.run_id))
                rec.save(out / "runs")
                counts["ok" if rec.outcome == "ok" else "failed"] += 1
                bar.update(task, advance=1, ok=counts["ok"], failed=counts["failed"])
                return rec

            async with runs.warm(jobs if executor is None else 0, len(specs)):
                return list(await asyncio.gather(*(one(rs) for rs in specs)))

    # An exhaustive campaign whose trace listed no hit has no schedule, so no run.
    no_runs = "ran no run" + (": the trace found no failpoint hit" if schedules is not None else "")
    with runs.zygote():
        return _run_and_report(
            spec, runs, specs, all_runs, out, stdout, retries, state_root, shrink_failures,
            shrink_budget, by_id={rs.run_id: rs for rs in specs}, meta=meta, started=started,
            no_runs=no_runs,
        )  # fmt: skip


def _run_and_report(
    spec: CampaignSpec,
    runs: _Runs,
    specs: Sequence[RunSpec],
    all_runs: Callable[[], Any],
    out: Path,
    stdout: IO[str] | None,
    retries: int,
    state_root: str,
    shrink_failures: bool,
    shrink_budget: int,
    *,
    by_id: dict[str, RunSpec],
    meta: dict[str, Any],
    started: float,
    no_runs: str = "ran no run",
) -> CampaignResult:
    """The runs, then the replays and shrinks of the failed ones, then the SUMMARY."""
    records = asyncio.run(all_runs())
    w = stdout if stdout is not None else sys.stdout
    extra = scenario_fields(records, registration(spec.scenario).summary_fields)
    stories = [r.extra["trace"] for r in records if isinstance(r.extra.get("trace"), list)]
    if stories:  # the points a trace can show (a redrive run's cluster writes none)
        cov = coverage_of(stories)
        extra["coverage"] = cov.fraction()
        if (k := killed_at(cov, meta.get("exhaustive"))) is not None:
            extra["killed_at"] = k.fraction()
    result = CampaignResult(
        spec, out, records,
        Summary.of(records, mode=spec.mode, backend=spec.backend, seed_base=spec.seed_base,
                   extra=extra),
        untested=earned.campaign_shortfall(records, spec) if records else no_runs,
    )  # fmt: skip
    for rec in result.failed:
        result.repros[rec.run_id] = rec.repro
        why = ",".join(rec.failing_checks()) or rec.outcome
        kept = str(out / "runs" / f"{rec.run_id}.json")
        exact = shlex.join(["durable-spaces", "repro", "--exact", kept])
        emit(w, f"REPRO {rec.run_id} ({why}): {rec.repro}")
        emit(w, f"REPRO {rec.run_id} (exact): {exact}")
    for rec in result.failed:
        if rec.outcome != "failed" or not retries:
            continue
        rep = _retry(runs, rec, retries, state_root)
        if rep is not None:
            result.reproductions[rec.run_id] = rep
            rec.extra["reproduction"] = rep.to_json()
            rec.save(out / "runs")
            emit(w, rep.line())
    if shrink_failures:
        tries = itertools.count(1)  # unique tags for every candidate run
        for rec in result.failed:
            if rec.outcome != "failed":
                continue  # an error is not a checker failure to minimise
            rs = by_id[rec.run_id]
            if rs.schedule is None and rec.schedule is not None:
                rs = rs.with_(schedule=Schedule.from_json(rec.schedule))

            def still_fails(cand: RunSpec, rid: str = rec.run_id, tries: Any = tries) -> bool:
                tag = f".shrink{next(tries)}"
                cand = cand.with_(state_dir=os.path.join(state_root, rid + tag))
                return runs.run_sync(cand, tag).outcome == "failed"

            sr = shrink(rs, still_fails, max_calls=shrink_budget)
            result.shrunk[rec.run_id] = sr
            if sr.shrunk:
                assert sr.spec.schedule is not None or rs.schedule is None
                f = None
                if sr.spec.schedule is not None:
                    f = str(sr.spec.schedule.save(out / "schedules" / f"{rec.run_id}-shrunk.json"))
                cmd = sr.spec.repro(f)
                result.shrunk_repros[rec.run_id] = cmd
                emit(w, f"SHRUNK {rec.run_id} (calls {rs.calls}->{sr.spec.calls}): {cmd}")
    meta.update(
        finished_unix=time.time(),
        duration_s=round(time.time() - started, 3),
        summary=result.summary_line,
        repros=result.repros,
        shrunk=result.shrunk_repros,
        untested=result.untested,
    )
    (out / "campaign.json").write_text(json.dumps(meta, indent=2) + "\n")
    if result.untested is not None:
        emit(w, f"UNTESTED {result.untested}")
    emit(w, result.summary_line)
    return result
