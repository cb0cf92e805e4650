"""The ``durable-spaces-checkpoint`` recipe (the probe's control) end to end (recipe_trial.py):
uninterrupted, then killed while a step's command runs and resumed, by a kill of its
process group and by a kill of everything it started."""

from __future__ import annotations

from pathlib import Path

import pytest
from recipe_trial import (
    assert_once_or_reported,
    check_file_tools,
    check_killed_mid_step,
    check_uninterrupted,
)


def test_durable_spaces_checkpoint_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("durable-spaces-checkpoint", tmp_path)


@pytest.mark.parametrize("fault", ["process", "machine"])
def test_durable_spaces_checkpoint_resumes_after_a_kill_mid_step(
    tmp_path: Path, fault: str
) -> None:
    t = check_killed_mid_step("durable-spaces-checkpoint", tmp_path, fault)
    assert_once_or_reported(t)


def test_durable_spaces_checkpoint_file_tools_as_declared(tmp_path: Path) -> None:
    check_file_tools("durable-spaces-checkpoint", tmp_path)
