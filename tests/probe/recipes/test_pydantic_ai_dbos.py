"""The ``pydantic-ai-dbos`` recipe end to end (recipe_trial.py): uninterrupted, then killed while a
step's command runs and resumed (DBOS recovers the workflow)."""

from __future__ import annotations

from pathlib import Path

from recipe_trial import check_killed_mid_step, check_uninterrupted


def test_pydantic_ai_dbos_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("pydantic-ai-dbos", tmp_path)


def test_pydantic_ai_dbos_resumes_after_a_kill_mid_step(tmp_path: Path) -> None:
    t = check_killed_mid_step("pydantic-ai-dbos", tmp_path)
    # Only model requests are DBOS steps (recorded, not sent again: 4 requests in all);
    # recovery runs the workflow from its start, so step 1's tool runs again, then step 2.
    assert t.log() == ["s1", "s1", "s2", "s3"] and len(t.requests()) == 4
