"""The ``pi`` recipe end to end (recipe_trial.py): uninterrupted, then killed while a
step's command runs and resumed with ``pi -p -c "continue"``. Skipped where Pi is not
installed (images/probe/ci-setup.sh installs it)."""

from __future__ import annotations

from pathlib import Path

from recipe_trial import check_file_tools, check_killed_mid_step, check_uninterrupted


def test_pi_runs_the_task(tmp_path: Path) -> None:
    check_uninterrupted("pi", tmp_path)


def test_pi_resumes_after_a_kill_mid_step(tmp_path: Path) -> None:
    t = check_killed_mid_step("pi", tmp_path)
    # Pi's bash runs its command in a session of its own: the kill of Pi's process group
    # leaves it running to its end (its effect lands after the kill, in any order with the
    # resumed run's). The resumed request shows the model a result Pi made up for the
    # unanswered call, and the command never runs again.
    assert sorted(t.log()) == ["s1", "s2", "s3"] and t.step2_starts == 1
    shown = [m["content"] for m in t.requests()[-1]["messages"] if m["role"] == "tool"]
    assert shown[1] == "No result provided"


def test_pi_file_tools_as_declared(tmp_path: Path) -> None:
    check_file_tools("pi", tmp_path)
