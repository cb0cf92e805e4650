"""The ``langgraph`` recipe end to end (recipe_trial.py): uninterrupted, then killed while a
step's command runs and resumed."""

from __future__ import annotations

from pathlib import Path

from recipe_trial import check_killed_mid_step, check_uninterrupted


def test_langgraph_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("langgraph", tmp_path)


def test_langgraph_resumes_after_a_kill_mid_step(tmp_path: Path) -> None:
    t = check_killed_mid_step("langgraph", tmp_path)
    # Killed with it, the command never made its effect; the tools node runs again from
    # its start on resume: the command twice, its effect once.
    assert t.log() == ["s1", "s2", "s3"] and t.step2_starts == 2
