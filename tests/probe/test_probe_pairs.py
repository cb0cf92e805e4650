"""The report's kill point x step table and the SUMMARY's ``pairs=x/y``: which planned
(kill point, step) pairs a probe ran, and how each graded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from durable_spaces.errors import RecordError
from durable_spaces.probe.checker import StepResult
from durable_spaces.probe.gates import GatePoint
from durable_spaces.probe.record import ProbeRecord
from durable_spaces.probe.report import coverage, render
from tests.probe.helpers import fake, probe


def _rec(run_id: str, point: GatePoint | None, landed: bool, *classes: str,
         outcome: str = "ok") -> ProbeRecord:  # fmt: skip
    return ProbeRecord(
        harness="h", recipe="/r/recipe.toml", run_id=run_id, seed=f"s-{run_id[1:]}",
        scenario="random", fault="process", steps=2, point=point, landed=landed,
        outcome=outcome,
        results=[StepResult(i + 1, "append", 1, 0, "output", c) for i, c in enumerate(classes)],
    )  # fmt: skip


def test_each_pair_says_how_it_graded_or_that_it_never_ran() -> None:
    planned = [GatePoint(1, "request"), GatePoint(2, "request"), GatePoint(3, "request"),
               GatePoint(1, "effect"), GatePoint(2, "effect"), GatePoint(2, "exited")]  # fmt: skip
    recs = [
        _rec("r0", None, False, "once", "once"),
        _rec("r1", GatePoint(1, "effect"), True, "duplicate", "once"),
        _rec("r2", GatePoint(1, "effect"), True, "once", "once"),
        _rec("r3", GatePoint(2, "request"), True, "once", "once"),
        _rec("r4", GatePoint(2, "exited"), False, "once", "once"),  # its fault never landed
        _rec("r5", GatePoint(3, "request"), False, outcome="lab_error"),
    ]
    assert coverage(recs, planned, steps=2) == [
        ["kill point", "step 1", "step 2", "final"],
        ["request", "not run", "exactly-once (1)", "lab error"],
        ["effect", "at-least-once (2)", "not run", "-"],
        ["exited", "-", "not landed", "-"],
    ]


def test_the_probe_says_how_many_planned_pairs_ran(tmp_path: Path) -> None:
    # two shell steps: 3 command points each, request and stream of three requests
    p = probe(tmp_path / "o", "--harness", fake("rerun"), "--runs", "3", "--steps", "2",
              "--seed-base", "cov", "--jobs", "1")  # fmt: skip
    assert p.code == 0, p.stdout + p.stderr
    ran = {r.point for r in p.records() if r.point is not None and r.landed}
    assert p.summary["pairs"] == f"{len(ran)}/12", p.stdout
    meta = json.loads((p.out / "probe.json").read_text())
    assert len(meta["pairs"]) == 12
    md = (p.out / "report.md").read_text()
    assert f"## Kill point x step: {len(ran)} of 12 planned pairs probed" in md
    table = md.split("planned pairs probed")[1].split("\n\n")[1].splitlines()
    assert table[0] == "| kill point | step 1 | step 2 | final |"
    cells = {(row.split(" | ")[0].strip("| "), i + 1): c.strip(" |")
             for row in table[2:] for i, c in enumerate(row.split(" | ")[1:])}  # fmt: skip
    assert sum(c == "not run" for c in cells.values()) == 12 - len(ran)
    for pt in ran:
        assert cells[(pt.where, pt.step)].endswith(")"), cells
    assert cells[("started", 3)] == "-"  # the final answer has no command
    assert "planned pairs probed</h2><table>" in (p.out / "report.html").read_text()

    # a probe of some kinds of point only covers those: the other pairs count, unprobed
    exhaustive = probe(tmp_path / "e", "--harness", fake("rerun"), "--scenario", "exhaustive",
                       "--steps", "1", "--at", "request")  # fmt: skip
    assert exhaustive.summary["pairs"] == "2/7", exhaustive.stdout
    assert exhaustive.summary["grade"] == "partial:exactly-once", exhaustive.stdout


def test_a_malformed_pair_in_probe_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    meta = {"kind": "probe-summary", "harness": "h", "recipe": "/r", "fault": "process",
            "scenario": "random", "steps": 2, "seed_base": "b", "grade": "none",
            "summary": "SUMMARY probe", "pairs": ["effect@1", "nowhere@2"]}  # fmt: skip
    (tmp_path / "probe.json").write_text(json.dumps(meta))
    with pytest.raises(RecordError, match="a pair is malformed"):
        render(tmp_path)
    meta["pairs"] = ["effect@999999"]
    (tmp_path / "probe.json").write_text(json.dumps(meta))
    with pytest.raises(RecordError, match="past 1001"):
        render(tmp_path)


def test_expect_fails_on_a_partial_grade_unless_the_user_accepts_it(tmp_path: Path) -> None:
    args = ("--harness", fake("correct"), "--scenario", "exhaustive", "--steps", "1",
            "--at", "request", "--expect", "at-most-once-reported")  # fmt: skip
    p = probe(tmp_path / "o", *args)
    assert p.code == 1, p.stdout + p.stderr
    assert p.summary["grade"] == "partial:exactly-once" and p.summary["pairs"] == "2/7"
    assert "covered only some kill point x step pairs (--allow-partial" in p.stderr
    assert "- coverage: 2 of 7 kill point x step pairs probed" in (p.out / "report.md").read_text()
    ok = probe(tmp_path / "ok", *args, "--allow-partial")
    assert ok.code == 0, ok.stdout + ok.stderr
