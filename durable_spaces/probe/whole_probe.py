"""A whole probe: the uninterrupted run, the planned runs in parallel, the verdict.

Exit codes (``ProbeResult.exit_code``): 0 the lab worked; 1 ``--expect`` and the grade is
worse, or partial where the user did not accept partial coverage; 3 some run broke in the
lab itself, or the uninterrupted run did not grade every step ``once`` (the probe cannot
tell this harness's faults from its plain behaviour: no grade); 4 not tested: no run with
a fault, or a planned fault never landed (``record.short_of_plan``). Bad input (a
malformed recipe, a launch or resume program that cannot start, a harness not installed,
one that asks the model what it cannot answer or never calls it) raises ``ConfigError``:
one line, exit 2, nothing left running; found before the planned runs where it can be.
"""

from __future__ import annotations

import json
import os
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
from durable_spaces.probe.gates import BLACK_BOX, STATE_WHERE, GatePoint
from durable_spaces.probe.grade import GRADES, PARTIAL, worse
from durable_spaces.probe.power import power_unavailable
from durable_spaces.probe.recipe import Recipe, program_error, resolve, values
from durable_spaces.probe.record import (
    FAULTS,
    ProbeRecord,
    probe_grade,
    short_of_plan,
    summary_line,
)
from durable_spaces.probe.runner import LAB_ENV, ProbeRun, cgroup_prefix, run_one

__all__ = [
    "AT_WORDS", "ProbeResult", "ProbeSpec", "check_available", "check_programs", "expand_at",
    "repro_line", "run_probe",
]  # fmt: skip

#: What ``--at`` takes: kinds of kill point, ``state`` (all three of the harness's state
#: operations) and ``all``.
AT_WORDS = (*BLACK_BOX, *STATE_WHERE, "state", "all")


def expand_at(words: tuple[str, ...]) -> tuple[str, ...]:
    """``--at``'s words as kinds of kill point (``ConfigError`` for an unknown one)."""
    out: list[str] = []
    for w in words:
        if w not in AT_WORDS:
            raise ConfigError(f"--at {w}: one of {', '.join(AT_WORDS)}")
        out += BLACK_BOX + STATE_WHERE if w == "all" else STATE_WHERE if w == "state" else (w,)
    return tuple(dict.fromkeys(out))


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
    at: tuple[str, ...] = ()  # only these kinds of kill point (the black box's when empty)
    per_step: bool = False  # the model's call ids per step (the older scheme)
    allow_partial: bool = False  # --expect accepts a grade from a probe of some pairs only
    effects: bool = False  # shell steps call an effect server too (effect_server.py)

    @property
    def state_points(self) -> bool:
        """The probe kills inside the harness's state writes (its state on powerfs)."""
        return any(w in STATE_WHERE for w in expand_at(self.at))

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
        expand_at(self.at)
        if self.state_points and self.fault not in ("process", "machine", "power"):
            raise ConfigError(f"--at {','.join(self.at)}: a state point takes a kill fault "
                              "(process, machine or power)")  # fmt: skip
        _fault_available(self.fault)
        if self.state_points and (why := power_unavailable()) is not None:
            raise ConfigError(why.replace("the power fault", "--at state"))


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


def check_programs(recipe: Recipe, cwd: Path) -> None:
    """``ConfigError`` when the launch or resume program cannot start (not found, not
    executable): a recipe's error, before any run."""
    vals = values(recipe, model_url="http://127.0.0.1:9/v1", workdir=cwd, state_dir=cwd,
                  run_id="check", prompt="")  # fmt: skip
    env = {**os.environ, **LAB_ENV, **{k: resolve(v, vals) for k, v in recipe.env.items()}}
    for label, argv in (("launch", recipe.launch), ("resume", recipe.resume)):
        why = program_error(label, [resolve(x, vals) for x in argv], env)
        if why is not None:
            raise ConfigError(f"recipe {recipe.path}: {why}")


def repro_line(path: Path) -> str:
    return shlex.join(["durable-spaces", "repro", str(path)])


def _spec(ps: ProbeSpec, run_id: str, seed: str, point: GatePoint | None, cg: bool,
          baseline: dict[int, str] | None = None) -> ProbeRun:  # fmt: skip
    return ProbeRun(recipe=ps.recipe, run_id=run_id, seed=seed, scenario=ps.scenario,
                   fault=ps.fault, steps=ps.steps, point=point, work=ps.out / "work" / run_id,
                   runs_dir=ps.out / "runs", use_cgroup=cg, per_step=ps.per_step,
                   baseline=baseline, trial=point is None,
                   state=ps.state_points, effects=ps.effects)  # fmt: skip


def unjudged(first: ProbeRecord) -> str | None:
    """Why the uninterrupted run cannot serve as this harness's plain behaviour, or None."""
    if first.judged:
        return None
    if first.outcome != "ok":
        return f"the uninterrupted run r0 did not finish: {first.outcome}: {first.reason}"
    if not first.results:
        return "the uninterrupted run r0 graded no step"
    bad = [f"{r.cls}@{r.step} (shown {r.shown}, effects {r.effects})" for r in first.results
           if r.cls != "once"]  # fmt: skip
    hint = ""
    if any(r.shown == "unverified" for r in first.results):
        hint = ("; a result without the step's output: does the harness send the command's "
                "output back to the model?")  # fmt: skip
    return f"the uninterrupted run r0 did not grade every step once: {' '.join(bad)}{hint}"


def run_probe(ps: ProbeSpec, stdout: IO[str] | None = None,
              progress: Callable[[ProbeRecord], None] | None = None) -> ProbeResult:  # fmt: skip
    ps.check()
    w = stdout if stdout is not None else sys.stdout
    runs_dir = ps.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    check_programs(ps.recipe, ps.out)
    check_available(ps.recipe, ps.out)
    cg = unavailable() is None
    started = time.time()
    first = run_one(_spec(ps, "r0", plan.run_seed(ps.seed_base, 0), None, cg))
    first.save(runs_dir)
    if first.outcome == "recipe_error":
        raise ConfigError(f"recipe {ps.recipe.path}: {first.reason}")
    if first.outcome == "refused":
        raise ConfigError(f"harness {ps.recipe.name}: {first.reason}")
    if first.outcome == "ok" and first.requests == 0:
        raise ConfigError(
            f"harness {ps.recipe.name} exited 0 without calling the model "
            "(does it take its model URL from the recipe's {model_url}?)"
        )
    if first.outcome == "lab_error":
        raise ConfigError(f"the probe's uninterrupted run broke in the lab: {first.reason}")
    reached = [GatePoint.parse(p) for p in first.reached]
    universe = plan.applicable(reached, ps.fault, BLACK_BOX)
    if ps.state_points:
        universe += plan.applicable(reached, ps.fault, expand_at(ps.at))
        universe = sorted(set(universe))
    why_not = unjudged(first)
    if why_not is not None:
        emit(w, f"UNJUDGED r0: {why_not}")
        return _finish(ps, w, [first], universe, started, 3, why_not, judged=False)
    points = plan.applicable(reached, ps.fault, expand_at(ps.at) or BLACK_BOX)
    planned = plan.draw(points, ps.scenario, ps.runs, ps.seed_base)
    records = [first]

    stop = threading.Event()

    def one(i: int, p: GatePoint) -> ProbeRecord:
        spec = _spec(ps, f"r{i}", plan.run_seed(ps.seed_base, i), p, cg, first.baseline)
        rec = run_one(replace(spec, stop=stop))
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
    broken = next((r for r in records if r.outcome == "recipe_error"), None)
    if broken is not None:
        raise ConfigError(f"recipe {ps.recipe.path}: {broken.reason} (run {broken.run_id})")
    for rec in records:
        if rec.failed:
            line = repro_line(runs_dir / f"{rec.run_id}.json")
            emit(w, f"REPRO {rec.run_id} ({rec.why()}): {line}")
        elif not ps.keep:
            shutil.rmtree(ps.out / "work" / rec.run_id, ignore_errors=True)
    grade = probe_grade(records, universe)
    reason = short_of_plan(records)
    code = 0
    if reason is not None:
        code = 4
    elif any(r.outcome == "lab_error" for r in records):
        code, reason = 3, "some runs broke in the lab (lab_errors)"
    elif ps.expect is not None and worse(grade, ps.expect):
        code, reason = 1, f"grade {grade} is worse than the expected {ps.expect}"
    elif ps.expect is not None and grade.startswith(PARTIAL) and not ps.allow_partial:
        code, reason = 1, (f"grade {grade}: the probe covered only some kill point x step "
                           "pairs (--allow-partial accepts that)")  # fmt: skip
    return _finish(ps, w, records, universe, started, code, reason or "")


def _finish(ps: ProbeSpec, w: IO[str], records: list[ProbeRecord],
            universe: list[GatePoint], started: float, code: int, reason: str,
            judged: bool = True) -> ProbeResult:  # fmt: skip
    """probe.json and the SUMMARY line."""
    summary = summary_line(ps.recipe.name, records, ps.seed_base, universe, judged)
    grade = probe_grade(records, universe, judged)
    meta = {
        "kind": "probe-summary", "harness": ps.recipe.name, "recipe": str(ps.recipe.path),
        "promise": ps.recipe.promise, "scenario": ps.scenario, "fault": ps.fault,
        "runs": len(records), "steps": ps.steps, "seed_base": ps.seed_base, "jobs": ps.jobs,
        "grade": grade, "summary": summary, "exit_code": code, "reason": reason,
        "pairs": [str(p) for p in universe], "at": list(ps.at),
        "call_ids": "per-step" if ps.per_step else "per-answer", "effects": ps.effects,
        "report": ps.recipe.report.pattern if ps.recipe.report is not None else "",
        "started_unix": started, "duration_s": round(time.time() - started, 3),
    }  # fmt: skip
    (ps.out / "probe.json").write_text(json.dumps(meta, indent=1) + "\n")
    emit(w, summary)
    return ProbeResult(records, summary, grade, code, reason, meta)


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
                   runs_dir=state_dir / "runs", use_cgroup=cg,
                   per_step=original.call_ids == "per-step",
                   baseline=original.baseline if original.point is not None else None,
                   state=original.point is not None and original.point.state,
                   effects=original.effects)  # fmt: skip
    rec = run_one(spec)
    rec.save(state_dir / "runs")
    same = [r.cls for r in rec.results] == [r.cls for r in original.results]
    same = same and rec.outcome == original.outcome
    emit(w, f"RESULT probe run={rec.run_id} harness={recipe.name} point={rec.point} "
          f"fault={rec.fault} landed={rec.landed} outcome={rec.outcome} ({rec.why()}) "
          f"as_recorded={'yes' if same else 'no'}")  # fmt: skip
    return 1 if rec.failed else 0
