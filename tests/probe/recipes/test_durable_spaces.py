"""The ``durable-spaces`` recipe (the probe's control) end to end (recipe_trial.py):
uninterrupted, then killed while a step's command runs and resumed, by a kill of its
process group and by a kill of everything it started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from recipe_trial import (
    assert_once_or_reported,
    check_file_tools,
    check_killed_mid_step,
    check_uninterrupted,
    load,
)


def test_durable_spaces_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("durable-spaces", tmp_path)


@pytest.mark.parametrize("fault", ["process", "machine"])
def test_durable_spaces_resumes_after_a_kill_mid_step(tmp_path: Path, fault: str) -> None:
    t = check_killed_mid_step("durable-spaces", tmp_path, fault)
    assert_once_or_reported(t)


def test_durable_spaces_file_tools_as_declared(tmp_path: Path) -> None:
    check_file_tools("durable-spaces", tmp_path)


@pytest.mark.parametrize("bad", ["-5", "x", "9223372036854775807", "\u0661"])
def test_durable_spaces_refuses_an_epoch_file_it_did_not_write(tmp_path: Path, bad: str) -> None:
    """The epoch counter is read back from the state dir: anything but an epoch below the
    driver's limit is one line, before a Space or a log is touched."""
    recipe = load("durable-spaces")
    state = tmp_path / "state"
    state.mkdir()
    (state / "epoch").write_text(bad)
    program = recipe.directory / "ds_agent.py"
    done = subprocess.run(
        [sys.executable, str(program), "--model-url", "http://127.0.0.1:9/v1",
         "--state", str(state), "--prompt", "go"],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"ds_agent: {state / 'epoch'} does not hold an epoch: {bad!r}"
    ]
    assert sorted(p.name for p in state.iterdir()) == ["epoch"]
