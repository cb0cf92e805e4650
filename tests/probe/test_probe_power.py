"""The power fault: the harness's state directory on powerfs, its unsynced writes dropped
at the kill. A harness that fsyncs its journal grades as under ``process``; one that does
not loses its journal and runs a step again."""

from __future__ import annotations

from pathlib import Path

import pytest

import durable_spaces.chaos.powerfs as powerfs
from durable_spaces.errors import RecordError
from durable_spaces.probe.power import power_unavailable
from durable_spaces.probe.record import ProbeRecord
from durable_spaces.probe.report import power_cuts
from tests.probe.helpers import fake, probe


@pytest.mark.fuse
def test_a_journal_never_fsynced_grades_worse_under_power(
    tmp_path: Path, no_leftovers: None
) -> None:
    args = ("--harness", fake("nosync"), "--scenario", "exhaustive", "--steps", "1",
            "--at", "request")  # fmt: skip
    proc = probe(tmp_path / "process", *args, "--fault", "process")
    power = probe(tmp_path / "power", *args, "--fault", "power")
    assert proc.code == 0 and power.code == 0, proc.stdout + power.stdout + power.stderr
    assert proc.summary["grade"] == "partial:exactly-once", proc.stdout  # requests only
    # killed at the second request, its journal (user, call, result) was never durable:
    # the resumed harness starts over and runs step 1's command again
    assert power.summary["grade"] == "partial:at-least-once", power.stdout
    assert power.summary["duplicate"] == "1" and power.summary["kills"] == "2", power.stdout
    (r2,) = [r for r in power.records() if r.run_id == "r2"]
    assert [r.cls for r in r2.results] == ["duplicate"]
    assert r2.attempts[0]["dropped"]["bytes"] > 0, r2.attempts
    assert "- power cuts: 2 cuts of the state directory" in (power.out / "report.md").read_text()


@pytest.mark.fuse
def test_a_journal_fsynced_grades_as_under_process(tmp_path: Path, no_leftovers: None) -> None:
    args = ("--harness", fake("correct"), "--scenario", "exhaustive", "--steps", "1")
    proc = probe(tmp_path / "process", *args, "--fault", "process")
    power = probe(tmp_path / "power", *args, "--fault", "power")
    assert proc.code == 0 and power.code == 0, proc.stdout + power.stdout + power.stderr
    assert power.summary["grade"] == proc.summary["grade"] == "at-most-once-reported"
    for p in (proc, power):
        assert p.summary["duplicate"] == p.summary["lost"] == "0", p.stdout
        assert p.summary["kills"] == "7", p.stdout
        # at the model's points nothing was cut short: every step exactly once
        model = [r for r in p.records() if r.point and r.point.where in ("request", "stream")]
        assert model and all(r.classes == ["once"] for r in model), p.stdout
    cut = [a for r in power.records() for a in r.attempts if "dropped" in a]
    assert len(cut) == 7, cut


def test_without_powerfs_the_probe_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(powerfs, "unavailable", lambda: "/dev/fuse cannot be opened (test)")
    assert power_unavailable() == (
        "the power fault needs powerfs: /dev/fuse cannot be opened (test)"
    )
    p = probe(tmp_path / "o", "--harness", fake("correct"), "--fault", "power")
    assert p.code == 2, p.stdout + p.stderr
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("durable-spaces:")]
    assert line == ("durable-spaces: error: the power fault needs powerfs: /dev/fuse cannot "
                    "be opened (test)")  # fmt: skip
    assert not (tmp_path / "o" / "runs").exists() or not any((tmp_path / "o" / "runs").iterdir())


def test_a_malformed_power_cut_in_a_record_is_refused() -> None:
    rec = ProbeRecord(harness="h", recipe="/r", run_id="r1", seed="s-1", scenario="random",
                    fault="power", steps=1, point=None,
                    attempts=[{"command": "launch", "dropped": {"ops": "many"}}])  # fmt: skip
    with pytest.raises(RecordError, match="power cut is malformed"):
        power_cuts([rec])
    rec.attempts[0]["dropped"] = {"ops": 3, "bytes": 70}
    assert power_cuts([rec]).startswith("1 cuts of the state directory (powerfs) dropped 3 ")
