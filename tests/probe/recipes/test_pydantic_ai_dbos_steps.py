"""The ``pydantic-ai-dbos-steps`` recipe end to end (recipe_trial.py): uninterrupted, then
killed while a step's command runs and resumed (DBOS recovers the workflow)."""

from __future__ import annotations

from pathlib import Path

from recipe_trial import check_killed_mid_step, check_uninterrupted


def test_pydantic_ai_dbos_steps_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("pydantic-ai-dbos-steps", tmp_path)


def test_pydantic_ai_dbos_steps_resumes_after_a_kill_mid_step(tmp_path: Path) -> None:
    t = check_killed_mid_step("pydantic-ai-dbos-steps", tmp_path)
    # Step 1's recorded result is replayed; the interrupted step 2 runs again from its start.
    assert t.log() == ["s1", "s2", "s3"] and t.step2_starts == 2 and len(t.requests()) == 4
