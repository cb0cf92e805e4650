"""The ``pydantic-ai-dbos-durable`` recipe end to end (recipe_trial.py): uninterrupted, its
file tools, then killed while a step's command runs and resumed: DBOS runs the workflow
from its start, every tool call again, and each finds its call in the adapter's log."""

from __future__ import annotations

from pathlib import Path

import pytest
from recipe_trial import check_file_tools, check_killed_mid_step, check_uninterrupted


def test_pydantic_ai_dbos_durable_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("pydantic-ai-dbos-durable", tmp_path)


def test_pydantic_ai_dbos_durable_file_tools_as_declared(tmp_path: Path) -> None:
    check_file_tools("pydantic-ai-dbos-durable", tmp_path)


@pytest.mark.parametrize("fault", ["process", "machine"])
def test_pydantic_ai_dbos_durable_resumes_after_a_kill_mid_step_with_each_effect_once(
    tmp_path: Path, fault: str
) -> None:
    t = check_killed_mid_step("pydantic-ai-dbos-durable", tmp_path, fault)
    # The plain recipe's recovery ran step 1's tool again (s1 twice); here it is adopted.
    assert t.log() == ["s1", "s2", "s3"] and len(t.requests()) == 4
