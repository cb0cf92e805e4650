"""The ``langgraph-async`` recipe end to end (recipe_trial.py): uninterrupted, then killed while a
step's command runs and resumed."""

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


def test_langgraph_async_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("langgraph-async", tmp_path)


def test_langgraph_async_resumes_after_a_kill_mid_step(tmp_path: Path) -> None:
    t = check_killed_mid_step("langgraph-async", tmp_path)
    # Killed with it, the command never made its effect; the tools node runs again from
    # its start on resume: the command twice, its effect once.
    assert t.log() == ["s1", "s2", "s3"] and t.step2_starts == 2


def test_langgraph_async_resumes_a_thread_whose_last_checkpoint_was_lost(tmp_path: Path) -> None:
    """With async durability a kill can keep a node's writes without the checkpoint after
    them; LangGraph's ``get_state`` then reads ``next`` empty, as if the thread had ended
    (a probe run saw it: the resume exited 0 with steps 2 and 3 lost). Made here by
    deleting the thread's latest checkpoint after a kill: resume must still finish."""
    recipe = load("langgraph-async")
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
            (now,) = db.execute("SELECT max(checkpoint_id) FROM checkpoints").fetchone()
            kept = db.execute("SELECT count(*) FROM writes WHERE checkpoint_id = ?", (now,))
            kept_writes = kept.fetchone()[0]
        db.close()
        assert kept_writes > 0  # the agent node's second call: its writes, no checkpoint after
        assert t.run("resume") == 0, t.outputs[-1][-3000:]
        assert t.log()[-1:] == ["s3"], t.outputs[-1][-3000:]
