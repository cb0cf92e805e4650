"""Run records round-trip and are checked when read; the SUMMARY line; the not-tested rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from durable_spaces.errors import RecordError
from durable_spaces.probe.checker import StepResult
from durable_spaces.probe.gates import GatePoint
from durable_spaces.probe.record import ProbeRecord, short_of_plan, summary_line


def _rec(run_id: str, point: GatePoint | None, landed: bool, *classes: str,
         outcome: str = "ok") -> ProbeRecord:  # fmt: skip
    return ProbeRecord(
        harness="h", recipe="/r/recipe.toml", run_id=run_id, seed=f"s-{run_id}",
        scenario="random", fault="process", steps=len(classes), point=point, landed=landed,
        outcome=outcome,
        results=[StepResult(i + 1, "append", 1, 0, "output", c) for i, c in enumerate(classes)],
    )  # fmt: skip


def test_summary_and_the_rule(tmp_path: Path) -> None:
    recs = [_rec("r0", None, False, "once", "once"),
            _rec("r1", GatePoint(1, "effect"), True, "duplicate", "once"),
            _rec("r2", GatePoint(2, "started"), True, "reported", outcome="stuck")]  # fmt: skip
    planned = [
        GatePoint(1, "request"),
        GatePoint(1, "effect"),
        GatePoint(1, "exited"),
        GatePoint(2, "started"),
    ]
    assert summary_line("h", recs, "sb", planned) == (
        "SUMMARY probe harness=h runs=3 steps=5 once=3 duplicate=1 lost=0 phantom=0 "
        "reported=1 unverified=0 orphan=0 stuck=1 lab_errors=0 kills=2 pairs=2/4 grade=unsafe "
        "seed_base=sb"
    )
    # unsafe is final; any better grade from half the pairs says it saw half
    fine = [_rec("r0", None, False, "once"), _rec("r1", GatePoint(1, "effect"), True, "once")]
    assert summary_line("h", fine, "sb", planned).endswith(
        "pairs=1/4 grade=partial:exactly-once seed_base=sb"
    )
    assert "grade=exactly-once " in summary_line("h", fine, "sb", [GatePoint(1, "effect")])
    assert "grade=none " in summary_line("h", fine, "sb", planned, judged=False)
    # a fault that never landed probed nothing: still 2 of 4
    missed = [*recs, _rec("r9", GatePoint(1, "exited"), False, "once")]
    assert "pairs=2/4" in summary_line("h", missed, "sb", planned)
    assert short_of_plan(recs) is None
    recs.append(_rec("r3", GatePoint(1, "exited"), False, "once"))
    assert short_of_plan(recs) == "1 of 3 planned faults never landed (r3:exited@1)"
    assert short_of_plan(recs[:1]).startswith("no run with a fault")  # type: ignore[union-attr]
    path = recs[1].save(tmp_path)
    back = ProbeRecord.load(path)
    assert back.to_json() == recs[1].to_json()


@pytest.mark.parametrize(
    ("change", "says"),
    [({"kind": "campaign"}, "not a probe run record"), ({"run_id": "../x"}, "malformed"),
     ({"fault": "quake"}, "unknown fault"), ({"point": "late@1"}, "not a kill point"),
     ({"steps": "many"}, "malformed probe run record")],
)  # fmt: skip
def test_a_bad_record_is_refused(tmp_path: Path, change: dict[str, str], says: str) -> None:
    data = _rec("r1", GatePoint(1, "effect"), True, "once").to_json() | change
    (tmp_path / "r1.json").write_text(json.dumps(data))
    with pytest.raises(RecordError, match=says):
        ProbeRecord.load(tmp_path / "r1.json")
