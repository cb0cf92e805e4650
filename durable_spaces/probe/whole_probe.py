"""A whole probe: the uninterrupted run, the planned runs in parallel, the verdict.

Exit codes (``ProbeResult.exit_code``): 0 the lab worked; 1 ``--expect`` and the grade is
worse; 3 some run broke in the lab itself; 4 not tested: no run with a fault, or a planned
fault never landed (``record.short_of_plan``). Bad input (a malformed recipe, a harness not
installed, one that asks the model what it cannot answer or never calls it) raises
``ConfigError`` before any planned run: one line, exit 2, nothing left running.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from durable_spaces.errors import ConfigError
from durable_spaces.host.cgroup import unavailable
from durable_spaces.probe import plan
from durable_spaces.probe.faults import machine_unavailable, sweep
from durable_spaces.probe.gates import COMMAND_WHERE, MODEL_WHERE, GatePoint
from durable_spaces.probe.grade import GRADES, worse
from durable_spaces.probe.power import power_unavailable
from durable_spaces.probe.recipe import Recipe, resolve, values
from durable_spaces.probe.record import FAULTS, ProbeRecord, grade_all, short_of_plan, summary_line
from durable_spaces.probe.runner import ProbeRun, cgroup_prefix, run_one

__all__ = ["ProbeResult", "ProbeSpec", "check_available", "repro_line", "run_probe"]


def emit(w: IO[str], line: str) -> None:
    """Write one result line whole (``print`` writes its newline apart when Python runs
    unbuffered, and a line teed to a file then met a stderr line between the two)."""
    w.write(f"{line}\n")
    w.flush()


@dataclass(frozen=True)
class ProbeSpec:
    recipe: Recipe
    out: Path
    scenario: str = "random"
    fault: str = "process"
    runs: int = 20
    steps: int = 5
    seed_base: str = "probe"
    jobs: int = 2
    expect: str | None = None
    keep: bool = False
    at: tuple[str, ...] = ()  # only these kinds of kill point (all when empty)

    def check(self) -> None:
        if self.scenario not in plan.SCENARIOS:
            raise ConfigError(f"--scenario {self.scenario}: one of {', '.join(plan.SCENARIOS)}")
        if self.fault not in FAULTS:
            raise ConfigError(f"--fault {self.fault}: one of {', '.join(FAULTS)}")
        if not 1 <= self.steps <= 100:
            raise ConfigError(f"--steps must be from 1 to 100, not {self.steps}")
        if not 0 <= self.runs <= 100000:
            raise ConfigError(f"--runs must be from 0 to 100000, not {self.runs}")
        if not 1 <= self.jobs <= 64:
            raise ConfigError(f"--jobs must be from 1 to 64, not {self.jobs}")
        if self.expect is not None and self.expect not in GRADES:
            raise ConfigError(f"--expect {self.expect}: one of {', '.join(GRADES)}")
        if not self.seed_base or not all(c.isalnum() or c in "_.:" for c in self.seed_base):
            raise ConfigError("--seed-base: letters, digits, '_', '.', ':' only")
        bad = [w for w in self.at if w not in MODEL_WHERE + COMMAND_WHERE]
        if bad:
            raise ConfigError(f"--at {bad[0]}: one of {', '.join(MODEL_WHERE + COMMAND_WHERE)}")
        _fault_available(self.fault)


def _fault_available(fault: str) -> None:
    """``ConfigError`` (one line) when this machine cannot make ``fault``."""
    if fault == "machine" and (why := machine_unavailable()) is not None:
        raise ConfigError(why)
    if fault == "power" and (why := power_unavailable()) is not None:
        raise ConfigError(why)


@dataclass
class ProbeResult:
    records: list[ProbeRecord]
    summary: str
    grade: str
    exit_code: int
    reason: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def check_available(recipe: Recipe, cwd: Path) -> None:
    """``ConfigError`` when the recipe's ``available`` command says it is not installed."""
    if not recipe.available:
        return
    vals = values(recipe, model_url="http://127.0.0.1:9/v1", workdir=cwd, state_dir=cwd,
                  run_id="check", prompt="")  # fmt: skip
    argv = [resolve(x, vals) for x in recipe.available]
    try:
        p = subprocess.run(argv, cwd=cwd, capture_output=True, timeout=recipe.timeout_s,
                           stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(
            f"harness {recipe.name} is not available: {shlex.join(argv)}: {e}"
        ) from None
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).decode("utf-8", "replace").strip().splitlines()
        why = tail[-1][:200] if tail else f"exit {p.returncode}"
        raise ConfigError(f"harness {recipe.name} is not installed ({shlex.join(argv)}: {why})")


def repro_line(path: Path) -> str:
    return shlex.join(["durable-spaces", "repro", str(path)])


def _spec(ps: ProbeSpec, run_id: str, seed: str, point: GatePoint | None, cg: bool) -> ProbeRun:
    return ProbeRun(recipe=ps.recipe, run_id=run_id, seed=seed, scenario=ps.scenario,
                   fault=ps.fault, steps=ps.steps, point=point, work=ps.out / "work" / run_id,
                   runs_dir=ps.out / "runs", use_cgroup=cg)  # fmt: skip


def run_probe(ps: ProbeSpec, stdout: IO[str] | None = None,
              progress: Callable[[ProbeRecord], None] | None = None) -> ProbeResult:  # fmt: skip
    ps.check()
    w = stdout if stdout is not None else sys.stdout
    runs_dir = ps.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    check_available(ps.recipe, ps.out)
    cg = unavailable() is None
    started = time.time()
    first = run_one(_spec(ps, "r0", plan.run_seed(ps.seed_base, 0), None, cg))
    first.save(runs_dir)
    if first.outcome == "refused":
        raise ConfigError(f"harness {ps.recipe.name}: {first.reason}")
    if first.outcome == "ok" and first.requests == 0:
        raise ConfigError(
            f"harness {ps.recipe.name} exited 0 without calling the model "
            "(does it take its model URL from the recipe's {model_url}?)"
        )
    if first.outcome == "lab_error":
        raise ConfigError(f"the probe's uninterrupted run broke in the lab: {first.reason}")
    if first.outcome == "stuck":
        emit(w, f"STUCK r0 (uninterrupted): {first.reason}")
    points = plan.applicable([GatePoint.parse(p) for p in first.reached], ps.fault, ps.at)
    planned = plan.draw(points, ps.scenario, ps.runs, ps.seed_base)
    records = [first]

    stop = threading.Event()

    def one(i: int, p: GatePoint) -> ProbeRecord:
        rec = run_one(replace(_spec(ps, f"r{i}", plan.run_seed(ps.seed_base, i), p, cg), stop=stop))
        rec.save(runs_dir)
        if progress is not None:
            progress(rec)
        return rec

    pool = ThreadPoolExecutor(max_workers=ps.jobs)
    try:
        records += list(pool.map(one, range(1, len(planned) + 1), planned))
    except BaseException:  # ^C: no further attempt, and nothing of the runs left running
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        sweep(cgroup_prefix())
        raise
    pool.shutdown()
    for rec in records:
        if rec.failed:
            line = repro_line(runs_dir / f"{rec.run_id}.json")
            emit(w, f"REPRO {rec.run_id} ({rec.why()}): {line}")
        elif not ps.keep:
            shutil.rmtree(ps.out / "work" / rec.run_id, ignore_errors=True)
    summary = summary_line(ps.recipe.name, records, ps.seed_base, points)
    grade = grade_all(records)
    reason = short_of_plan(records)
    code = 0
    if reason is not None:
        code = 4
    elif any(r.outcome == "lab_error" for r in records):
        code, reason = 3, "some runs broke in the lab (lab_errors)"
    elif ps.expect is not None and worse(grade, ps.expect):
        code, reason = 1, f"grade {grade} is worse than the expected {ps.expect}"
    meta = {
        "kind": "probe-summary", "harness": ps.recipe.name, "recipe": str(ps.recipe.path),
        "promise": ps.recipe.promise, "scenario": ps.scenario, "fault": ps.fault,
        "runs": len(records), "steps": ps.steps, "seed_base": ps.seed_base, "jobs": ps.jobs,
        "grade": grade, "summary": summary, "exit_code": code, "reason": reason or "",
        "pairs": [str(p) for p in points],
        "started_unix": started, "duration_s": round(time.time() - started, 3),
    }  # fmt: skip
    (ps.out / "probe.json").write_text(json.dumps(meta, indent=1) + "\n")
    emit(w, summary)
    return ProbeResult(records, summary, grade, code, reason or "", meta)


def replay(path: Path, state_dir: Path, stdout: IO[str] | None = None) -> int:
    """Run a recorded probe run again (same recipe, seed, point, fault, steps) under
    ``state_dir``; print how it went beside the record; 0 unless the replay failed."""
    from durable_spaces.probe.recipe import load

    w = stdout if stdout is not None else sys.stdout
    original = ProbeRecord.load(path)
    recipe = load(original.recipe)
    cg = unavailable() is None
    _fault_available(original.fault)
    spec = ProbeRun(recipe=recipe, run_id=original.run_id, seed=original.seed,
                   scenario=original.scenario, fault=original.fault, steps=original.steps,
                   point=original.point, work=state_dir / "work" / original.run_id,
                   runs_dir=state_dir / "runs", use_cgroup=cg)  # fmt: skip
    rec = run_one(spec)
    rec.save(state_dir / "runs")
    same = [r.cls for r in rec.results] == [r.cls for r in original.results]
    same = same and rec.outcome == original.outcome
    emit(w, f"RESULT probe run={rec.run_id} harness={recipe.name} point={rec.point} "
          f"fault={rec.fault} landed={rec.landed} outcome={rec.outcome} ({rec.why()}) "
          f"as_recorded={'yes' if same else 'no'}")  # fmt: skip
    return 1 if rec.failed else 0
