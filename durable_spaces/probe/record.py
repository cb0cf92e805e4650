"""A probe run's record (JSON, ``kind: probe``), the SUMMARY line, and whether the runs
tested what they planned.

A record is data from the plan to the verdict: the harness and its recipe, the seed, the
planned point and fault and whether it landed, each attempt, each step's class, the
outcome (``ok``, ``stuck``, ``refused``: the harness asked what the scripted model cannot
answer, ``recipe_error``: its launch or resume program cannot start, ``lab_error``), the
scheme of the model's call ids, and for a kill inside the harness's state writes the
operation it held (``state_hit``; the uninterrupted run keeps every such operation it
made, ``state_ops``). The requests the model received are kept beside it
(``<run>.requests.json``). Values read back are checked (``RecordError``): a record is
replayed by ``durable-spaces repro``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_spaces.errors import BadFileError, RecordError
from durable_spaces.host.bounded import load_json
from durable_spaces.probe.checker import CLASSES, StepResult
from durable_spaces.probe.faults import KILL_FAULTS, MODEL_FAULTS
from durable_spaces.probe.gates import GatePoint
from durable_spaces.probe.grade import NONE, grade_of, qualified

__all__ = [
    "CALL_IDS", "KIND", "OUTCOMES", "ProbeRecord", "covered", "pairs_probed", "probe_grade",
    "short_of_plan", "summary_line",
]  # fmt: skip

KIND = "probe"
OUTCOMES = ("ok", "stuck", "refused", "recipe_error", "lab_error")
#: The scripted model's call ids: new at every answer, or the step's own (task.py).
CALL_IDS = ("per-answer", "per-step")
FAULTS = (*KILL_FAULTS, *MODEL_FAULTS)
_ID = re.compile(r"r\d{1,7}")
_SEED = re.compile(r"[A-Za-z0-9_.:-]{1,80}")
MAX_RECORD_BYTES = 16 << 20
#: The most steps a record may name.
MAX_STEPS = 1000
#: The most of a baseline result a record keeps.
MAX_RESULT = 4096


@dataclass
class ProbeRecord:
    harness: str
    recipe: str  # the recipe.toml's absolute path
    run_id: str
    seed: str
    scenario: str
    fault: str
    steps: int
    point: GatePoint | None
    landed: bool = False
    outcome: str = "ok"
    reason: str = ""
    results: list[StepResult] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    reached: list[str] = field(default_factory=list)  # points seen (the uninterrupted run)
    duration_ms: float = 0.0
    harness_ms: float = 0.0  # the attempts' own wall time
    call_ids: str = "per-answer"
    state_hit: dict[str, Any] | None = None  # the state operation a state point held
    state_ops: list[dict[str, Any]] = field(default_factory=list)  # r0's, under --at state
    #: File steps' results in the uninterrupted run (shown.py), normalized: r0's own, or
    #: the ones a planned run held its results against.
    baseline: dict[int, str] = field(default_factory=dict)
    effects: bool = False  # shell steps called the effect server too (effect_server.py)

    @property
    def classes(self) -> list[str]:
        out = [r.cls for r in self.results]
        return [*out, "stuck"] if self.outcome == "stuck" else out

    @property
    def failed(self) -> bool:
        """Worse than at-most-once-reported: a step duplicated, lost, phantom, orphaned, or
        the run stuck (or refused, or broken by the lab)."""
        if self.outcome not in ("ok", "stuck"):
            return True
        return any(c not in ("once", "reported") for c in self.classes)

    def why(self) -> str:
        bad = [f"{r.cls}@{r.step}" for r in self.results if r.cls not in ("once", "reported")]
        if self.outcome != "ok":
            bad.append(self.outcome)
        kill = f"{self.fault} at {self.point}" if self.point else "no fault"
        return f"{' '.join(bad) or 'ok'}; {kill}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KIND, "version": 2, "harness": self.harness, "recipe": self.recipe,
            "run_id": self.run_id, "seed": self.seed, "scenario": self.scenario,
            "fault": self.fault, "steps": self.steps,
            "point": None if self.point is None else str(self.point), "landed": self.landed,
            "outcome": self.outcome, "reason": self.reason,
            "results": [r.to_json() for r in self.results], "attempts": self.attempts,
            "requests": self.requests, "reached": self.reached,
            "duration_ms": round(self.duration_ms, 1), "harness_ms": round(self.harness_ms, 1),
            "grade": grade_of(self.classes), "call_ids": self.call_ids,
            "state_hit": self.state_hit, "state_ops": self.state_ops,
            "baseline": {str(k): v for k, v in self.baseline.items()},
            "effects": self.effects,
        }  # fmt: skip

    @staticmethod
    def from_json(d: Any) -> ProbeRecord:
        try:
            if not isinstance(d, dict) or d.get("kind") != KIND:
                raise RecordError("not a probe run record (kind is not 'probe')")
            rec = ProbeRecord(
                harness=str(d["harness"]), recipe=str(d["recipe"]), run_id=str(d["run_id"]),
                seed=str(d["seed"]), scenario=str(d["scenario"]), fault=str(d["fault"]),
                steps=int(d["steps"]),
                point=None if d["point"] is None else GatePoint.parse(str(d["point"])),
                landed=bool(d["landed"]), outcome=str(d["outcome"]), reason=str(d["reason"]),
                results=[StepResult.from_json(x) for x in d["results"]],
                attempts=list(d["attempts"]), requests=int(d["requests"]),
                reached=[str(x) for x in d.get("reached", [])],
                duration_ms=float(d["duration_ms"]), harness_ms=float(d["harness_ms"]),
                call_ids=str(d.get("call_ids", "per-step")),
                state_hit=_state_hit(d.get("state_hit")),
                state_ops=[_state_op(x) for x in d.get("state_ops") or ()],
                baseline={int(k): str(v)[:MAX_RESULT] for k, v in
                          dict(d.get("baseline") or {}).items()},
                effects=d.get("effects", False) is True,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise RecordError(f"a malformed probe run record: {e}") from None
        if not _ID.fullmatch(rec.run_id) or not _SEED.fullmatch(rec.seed):
            raise RecordError(f"run id {rec.run_id!r} or seed {rec.seed!r} is malformed")
        if rec.fault not in FAULTS or rec.outcome not in OUTCOMES:
            raise RecordError(f"unknown fault {rec.fault!r} or outcome {rec.outcome!r}")
        if not 1 <= rec.steps <= MAX_STEPS:
            raise RecordError(f"steps {rec.steps} out of range")
        if rec.point is not None and not rec.point.state and rec.point.step > rec.steps + 1:
            raise RecordError(f"point {rec.point} is past the run's {rec.steps} steps")
        if rec.call_ids not in CALL_IDS:
            raise RecordError(f"unknown call id scheme {rec.call_ids!r}")
        if any(r.cls not in (*CLASSES, "unfinished") for r in rec.results):
            raise RecordError("a step class is unknown")
        return rec

    @property
    def judged(self) -> bool:
        """As the uninterrupted run: it finished and every step was ``once`` (else the
        probe cannot tell this harness's faults from its plain behaviour)."""
        return (
            self.outcome == "ok"
            and bool(self.results)
            and all(r.cls == "once" for r in self.results)
        )

    def save(self, runs_dir: Path) -> Path:
        runs_dir.mkdir(parents=True, exist_ok=True)
        path = runs_dir / f"{self.run_id}.json"
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @staticmethod
    def load(path: Path) -> ProbeRecord:
        try:
            data = load_json(path, max_bytes=MAX_RECORD_BYTES)
        except BadFileError as e:
            raise RecordError(str(e)) from None
        except OSError as e:
            raise RecordError(f"{path} cannot be read: {e.strerror or e}") from None
        return ProbeRecord.from_json(data)


def _state_op(x: Any) -> dict[str, Any]:
    """One state operation read back (kind, n, path, step): checked, it reaches a report."""
    if not isinstance(x, dict):
        raise ValueError("a state operation is not an object")
    op = {"op": str(x["op"]), "n": int(x["n"]), "path": str(x["path"])[:4096],
          "step": int(x.get("step", 0))}  # fmt: skip
    GatePoint.parse(f"{op['op']}@{op['n']}")
    return op


def _state_hit(x: Any) -> dict[str, Any] | None:
    return None if x is None else _state_op(x)


def counts(records: Sequence[ProbeRecord]) -> Counter[str]:
    c: Counter[str] = Counter()
    for r in records:
        if r.outcome in ("lab_error", "recipe_error"):
            c["lab_errors"] += r.outcome == "lab_error"
            continue
        c["steps"] += len(r.results)
        c.update(x.cls for x in r.results if x.cls != "unfinished")
        c["stuck"] += r.outcome == "stuck"
        c["kills"] += bool(r.point and r.landed)
    return c


def outside(records: Sequence[ProbeRecord]) -> Counter[str]:
    """The shell steps by their count at the effect server: ``once`` (as often as the
    model's episodes), ``duplicate`` (more), ``lost`` (never, and the model shown it done),
    ``none`` (never; the model told it was cut off, or never shown it)."""
    c: Counter[str] = Counter()
    for r in records:
        if r.outcome in ("lab_error", "recipe_error"):
            continue
        for x in r.results:
            if x.outside < 0 or x.cls == "unfinished":
                continue
            if x.outside > max(x.episodes, 1):
                c["duplicate"] += 1
            elif x.outside:
                c["once"] += 1
            else:
                c["lost" if x.shown == "output" else "none"] += 1
    return c


def grade_all(records: Sequence[ProbeRecord]) -> str:
    return grade_of(c for r in records if r.outcome != "lab_error" for c in r.classes)


def covered(records: Sequence[ProbeRecord], universe: Sequence[GatePoint]) -> bool:
    """Every pair of ``universe`` had a run whose fault landed there."""
    return set(universe) <= pairs_probed(records)


def pairs_probed(records: Sequence[ProbeRecord]) -> set[GatePoint]:
    """The (kill point, step) pairs some run put its fault at, landed, not broken by the
    lab."""
    return {r.point for r in records
            if r.point and r.landed and r.outcome not in ("lab_error", "recipe_error")}  # fmt: skip


def probe_grade(records: Sequence[ProbeRecord], universe: Sequence[GatePoint],
                judged: bool = True) -> str:  # fmt: skip
    """The probe's grade: the worst class, ``partial:`` when some pair of ``universe`` went
    unprobed, ``none`` when the uninterrupted run could not be judged."""
    if not judged:
        return NONE
    return qualified(grade_all(records), covered(records, universe))


def summary_line(harness: str, records: Sequence[ProbeRecord], seed_base: str,
                 universe: Sequence[GatePoint] = (), judged: bool = True) -> str:  # fmt: skip
    """The SUMMARY line; ``pairs=x/y``: of the ``y`` pairs the fault applies to (every
    black-box kill point x step an exhaustive probe runs, and the state operations when
    they were asked for), the ``x`` some run probed."""
    c = counts(records)
    fields = [f"harness={harness}", f"runs={len(records)}", f"steps={c['steps']}"]
    fields += [f"{k}={c[k]}" for k in (*CLASSES, "stuck", "lab_errors", "kills")]
    pairs = set(universe)
    fields.append(f"pairs={len(pairs_probed(records) & pairs)}/{len(pairs)}")
    if any(r.effects for r in records):  # the effect server's count of each shell step
        out = outside(records)
        fields += [f"outside_{k}={out[k]}" for k in ("once", "duplicate", "lost")]
    fields += [f"grade={probe_grade(records, universe, judged)}", f"seed_base={seed_base}"]
    return "SUMMARY probe " + " ".join(fields)


def short_of_plan(records: Sequence[ProbeRecord]) -> str | None:
    """Why these runs do not test what they planned, in one line, or None. A run whose
    drawn fault never landed is not a test of it. (One small rule, meant to be swapped for
    the campaigns' own when it lands.)"""
    planned = [r for r in records if r.point is not None
               and r.outcome not in ("lab_error", "recipe_error")]  # fmt: skip
    if not planned:
        base = next((r for r in records if r.point is None), None)
        why = ""
        if base is not None:
            why = f" (uninterrupted run: {base.outcome}{': ' + base.reason if base.reason else ''})"
        return f"no run with a fault: the harness reached no kill point{why}"
    missed = [r for r in planned if not r.landed]
    if missed:
        ids = " ".join(f"{r.run_id}:{r.point}" for r in missed[:8])
        return f"{len(missed)} of {len(planned)} planned faults never landed ({ids})"
    return None
