"""The ``openai-agents-durable`` recipe end to end (recipe_trial.py): uninterrupted, its
file tools, then killed while a step's command runs and resumed: the session never saved
the turn, the model asked again answers the same call, found by its id in the adapter's
log."""

from __future__ import annotations

from pathlib import Path

import pytest
from recipe_trial import check_file_tools, check_killed_mid_step, check_uninterrupted


def test_openai_agents_durable_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("openai-agents-durable", tmp_path)


def test_openai_agents_durable_file_tools_as_declared(tmp_path: Path) -> None:
    check_file_tools("openai-agents-durable", tmp_path)


@pytest.mark.parametrize("fault", ["process", "machine"])
def test_openai_agents_durable_resumes_after_a_kill_mid_step_with_each_effect_once(
    tmp_path: Path, fault: str
) -> None:
    t = check_killed_mid_step("openai-agents-durable", tmp_path, fault)
    assert t.log() == ["s1", "s2", "s3"]
