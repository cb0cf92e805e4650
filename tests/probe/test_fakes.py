"""Fake harnesses, each with one known defect, graded as the defect implies, under both
kill faults (exhaustive over the command's points, one or two steps: fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_spaces.probe.faults import machine_unavailable
from tests.probe.helpers import fake, probe

COMMAND_POINTS = "started,effect,exited"

FAULTS = [
    "process",
    pytest.param("machine", marks=pytest.mark.skipif(
        machine_unavailable() is not None, reason=str(machine_unavailable()))),
]  # fmt: skip


@pytest.mark.parametrize("fault", FAULTS)
def test_correct_harness_grades_clean(tmp_path: Path, fault: str, no_leftovers: None) -> None:
    p = probe(tmp_path / "o", "--harness", fake("correct"), "--scenario", "exhaustive",
              "--steps", "2", "--fault", fault, "--expect", "at-most-once-reported")  # fmt: skip
    assert p.code == 0, p.stdout + p.stderr
    s = p.summary
    assert s["grade"] in ("exactly-once", "at-most-once-reported")
    # six command points (two shell steps) and request/stream of three requests
    assert int(s["kills"]) == 12 and int(s["reported"]) >= 1
    assert (p.out / "report.md").read_text().count("at-most-once-reported") >= 1
    assert (p.out / "report.html").exists()


@pytest.mark.parametrize("fault", FAULTS)
def test_rerun_after_restart_is_at_least_once(tmp_path: Path, fault: str) -> None:
    p = probe(tmp_path / "o", "--harness", fake("rerun"), "--scenario", "exhaustive",
              "--steps", "1", "--fault", fault, "--at", COMMAND_POINTS,
              "--expect", "at-most-once-reported")  # fmt: skip
    assert p.code == 1, p.stdout + p.stderr  # worse than expected
    s = p.summary
    assert s["grade"] == "partial:at-least-once"  # the command's points only
    assert int(s["duplicate"]) == 2  # killed after the effect and after the exit
    by_point = {str(r.point): [x.cls for x in r.results] for r in p.records()}
    assert by_point["effect@1"] == ["duplicate"] and by_point["exited@1"] == ["duplicate"]
    assert by_point["started@1"] == ["once"]
    assert p.stdout.count("REPRO ") == 2


@pytest.mark.parametrize("fault", FAULTS)
def test_success_recorded_before_running_is_unverified(tmp_path: Path, fault: str) -> None:
    p = probe(tmp_path / "o", "--harness", fake("phantom"), "--scenario", "exhaustive",
              "--steps", "1", "--fault", fault, "--at", COMMAND_POINTS,
              "--expect", "at-least-once")  # fmt: skip
    assert p.code == 1, p.stdout + p.stderr  # worse than at-least-once: it may be made up
    assert p.summary["grade"] == "partial:unverified"
    by_point = {str(r.point): r.results[0] for r in p.records() if r.point}
    # killed before its effect: the model is told "ok" for a call that never ran; the
    # word is no evidence, the model asked again and that call ran (one effect)
    started = by_point["started@1"]
    assert (started.cls, started.shown, started.effects, started.asks) == (
        "unverified",
        "unverified",
        1,
        2,
    )


@pytest.mark.parametrize("fault", FAULTS)
def test_detached_tools_orphan_only_under_process(tmp_path: Path, fault: str,
                                                 no_leftovers: None) -> None:  # fmt: skip
    p = probe(tmp_path / "o", "--harness", fake("detached"), "--scenario", "exhaustive",
              "--steps", "1", "--fault", fault, "--at", COMMAND_POINTS)  # fmt: skip
    assert p.code == 0, p.stdout + p.stderr
    started = next(r for r in p.records() if str(r.point) == "started@1")
    if fault == "process":
        # the command left the killed group, went on when the gate opened, wrote its effect
        assert started.results[0].cls == "orphan" and started.results[0].late == 1
        assert p.summary["grade"] == "unsafe"
    else:
        assert started.results[0].cls == "reported" and started.results[0].effects == 0
        assert int(p.summary["orphan"]) == 0
        assert p.summary["grade"] == "partial:at-most-once-reported"


@pytest.mark.parametrize("fault", FAULTS)
def test_never_finishes_cannot_be_judged(tmp_path: Path, fault: str, no_leftovers: None) -> None:
    p = probe(tmp_path / "o", "--harness", fake("hang"), "--scenario", "exhaustive",
              "--steps", "1", "--fault", fault, "--at", "request")  # fmt: skip
    assert p.code == 3, p.stdout + p.stderr  # no grade: as for a lab error
    assert p.summary["grade"] == "none" and p.summary["runs"] == "1"
    assert ("UNJUDGED r0: the uninterrupted run r0 did not finish: stuck: 2 attempts; the last "
            "timed out") in p.stdout  # fmt: skip


@pytest.mark.parametrize("fault", FAULTS)
def test_crash_at_start_cannot_be_judged(tmp_path: Path, fault: str) -> None:
    p = probe(tmp_path / "o", "--harness", fake("crash"), "--scenario", "exhaustive",
              "--steps", "1", "--fault", fault)  # fmt: skip
    assert p.code == 3, p.stdout + p.stderr
    assert p.summary["stuck"] == "1" and p.summary["grade"] == "none"
    (line,) = [x for x in p.stdout.splitlines() if x.startswith("UNJUDGED")]
    assert line.endswith("exited 1 before calling the model: "
                         "fakeagent: cannot start: the defect is crash")  # fmt: skip
    (why,) = [x for x in p.stderr.splitlines() if x.startswith("durable-spaces:")]
    assert why.startswith("durable-spaces: probe: the uninterrupted run r0 did not finish")
