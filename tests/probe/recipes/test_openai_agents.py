"""The ``openai-agents`` recipe end to end (recipe_trial.py): uninterrupted, then killed
while a step's command runs and resumed."""

from __future__ import annotations

from pathlib import Path

from recipe_trial import check_killed_mid_step, check_uninterrupted


def test_openai_agents_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("openai-agents", tmp_path)


def test_openai_agents_resumes_after_a_kill_mid_step(tmp_path: Path) -> None:
    check_killed_mid_step("openai-agents", tmp_path)
