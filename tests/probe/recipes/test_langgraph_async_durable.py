"""The ``langgraph-async-durable`` recipe end to end (recipe_trial.py): uninterrupted, then
killed while a step's command runs and resumed, and resumed from a thread whose last
checkpoint was lost: each effect once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from recipe_trial import (
    check_killed_mid_step,
    check_uninterrupted,
    load,
    release_step_two,
    skip_unless_available,
    slow_step_two,
    trial,
)


def test_langgraph_async_durable_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("langgraph-async-durable", tmp_path)


def test_langgraph_async_durable_resumes_after_a_kill_mid_step(tmp_path: Path) -> None:
    t = check_killed_mid_step("langgraph-async-durable", tmp_path)
    assert t.log() == ["s1", "s2", "s3"]


def test_langgraph_async_durable_resumes_a_thread_whose_last_checkpoint_was_lost(
    tmp_path: Path,
) -> None:
    """As the plain recipe's test makes it: the thread's newest checkpoint deleted after
    a kill (what async durability may lose); the resumed run asks the model again, which
    answers the same call, found in the adapter's log: each effect once."""
    recipe = load("langgraph-async-durable")
    skip_unless_available(recipe, tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    with trial(recipe, tmp_path, slow_step_two(marks)) as t:
        t.run_killed("launch", marks / "started-s2")
        release_step_two(marks)
        db = sqlite3.connect(tmp_path / "state" / "checkpoints.sqlite")
        with db:
            (latest,) = db.execute("SELECT max(checkpoint_id) FROM checkpoints").fetchone()
            db.execute("DELETE FROM checkpoints WHERE checkpoint_id = ?", (latest,))
            db.execute("DELETE FROM writes WHERE checkpoint_id = ?", (latest,))
        db.close()
        assert t.run("resume") == 0, t.outputs[-1][-3000:]
        t.wait_for_commands_with(str(marks))
        assert t.log() == ["s1", "s2", "s3"], t.outputs[-1][-3000:]
