"""Grades from evidence, never from words, on harnesses written another way (fakes/
shagent.sh, fakes/nodeagent.mjs): a made-up ``{"exit_code": 0, "error": null}`` is no
success; a JSON result whose ``"error"`` is null is no report; an honest report in words
the recipe declares is ``reported``, in words it does not, ``unverified``; a harness whose
results never carry the command's output cannot be judged. Each under the kill faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.probe.helpers import KILL_FAULTS, fake, probe


@pytest.mark.parametrize("fault", KILL_FAULTS)
def test_a_made_up_success_is_never_believed(tmp_path: Path, fault: str) -> None:
    p = probe(tmp_path / "o", "--harness", fake("madeup"), "--scenario", "exhaustive",
              "--steps", "1", "--fault", fault, "--at", "started,effect,exited",
              "--expect", "at-most-once-reported", "--allow-partial")  # fmt: skip
    assert p.code == 1, p.stdout + p.stderr  # its grade is worse than it claims
    assert p.summary["grade"] == "partial:unverified", p.stdout
    assert p.summary["reported"] == "0" and int(p.summary["unverified"]) == 3, p.stdout
    shown = {str(r.point): r.results[0] for r in p.records() if r.point}
    # killed after the effect: its made-up success shown, the output it should carry not
    assert (shown["effect@1"].shown, shown["effect@1"].cls) == ("unverified", "unverified")


@pytest.mark.parametrize("fault", KILL_FAULTS)
def test_json_results_whose_error_is_null_are_no_reports(tmp_path: Path, fault: str) -> None:
    p = probe(tmp_path / "o", "--harness", fake("jsonnull"), "--scenario", "exhaustive",
              "--steps", "2", "--fault", fault, "--at", "request,effect")  # fmt: skip
    assert p.code == 0, p.stdout + p.stderr
    first = p.records()[0]
    # its shell, write results: JSON with "error": null, the shell one with the output
    assert [(r.kind, r.cls) for r in first.results] == [("append", "once"), ("write", "once")]
    assert first.baseline == {2: '{"ok": true, "error": null}'}
    assert p.summary["grade"] == "partial:at-most-once-reported", p.stdout
    requests = [r for r in p.records() if r.point and r.point.where == "request"]
    assert requests and all(r.classes == ["once", "once"] for r in requests), p.stdout
    (effect,) = [r for r in p.records() if r.point and r.point.where == "effect"]
    assert effect.results[0].cls == "reported"  # {"status": "interrupted", ...}, declared


@pytest.mark.parametrize("fault", KILL_FAULTS)
def test_an_honest_report_in_other_words(tmp_path: Path, fault: str) -> None:
    args = ("--scenario", "exhaustive", "--steps", "1", "--fault", fault, "--at", "effect")
    declared = probe(tmp_path / "d", "--harness", fake("words"), *args)
    assert declared.code == 0, declared.stdout + declared.stderr
    assert declared.summary["grade"] == "partial:at-most-once-reported", declared.stdout
    assert declared.summary["reported"] == "1", declared.stdout
    # the same harness, its recipe silent on its words: the probe cannot tell its report
    # from a made-up success, and says so
    silent = tmp_path / "silent"
    silent.mkdir()
    text = (Path(fake("words")) / "recipe.toml").read_text().split("[report]")[0]
    (silent / "recipe.toml").write_text(text.replace("{recipe_dir}/..", fake("")))
    p = probe(tmp_path / "s", "--harness", str(silent), *args)
    assert p.code == 0, p.stdout + p.stderr
    assert p.summary["grade"] == "partial:unverified", p.stdout
    assert "none declared" in (p.out / "report.md").read_text()
    # asked again after a result it could not read, the model's own choice: no duplicate
    (r1,) = [r for r in p.records() if r.point]
    assert (r1.results[0].asks, r1.results[0].episodes, r1.results[0].effects) == (2, 2, 2)


def test_a_harness_that_never_passes_the_output_on_cannot_be_judged(tmp_path: Path) -> None:
    p = probe(tmp_path / "o", "--harness", fake("mute"), "--scenario", "exhaustive",
              "--steps", "1")  # fmt: skip
    assert p.code == 3, p.stdout + p.stderr
    assert p.summary["grade"] == "none" and p.summary["runs"] == "1"
    (line,) = [x for x in p.stdout.splitlines() if x.startswith("UNJUDGED r0: ")]
    assert "does the harness send the command's output back to the model?" in line
