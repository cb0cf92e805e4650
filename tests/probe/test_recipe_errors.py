"""A recipe error is not a grade: a launch or resume program that cannot start (not found,
not executable, the shell's 127) is one line and exit 2, found before the planned runs."""

from __future__ import annotations

from pathlib import Path

from tests.probe.helpers import fake, probe


def _error(p_stderr: str) -> str:
    (line,) = [x for x in p_stderr.splitlines() if x.startswith("durable-spaces:")]
    return line


def test_a_launch_program_not_installed(tmp_path: Path, no_leftovers: None) -> None:
    p = probe(tmp_path / "o", "--harness", fake("missing-launch"))
    assert p.code == 2, p.stdout + p.stderr
    assert _error(p.stderr).endswith(
        "missing-launch/recipe.toml: the launch program no-such-harness-program is not found "
        "on PATH")  # fmt: skip
    assert "SUMMARY" not in p.stdout and not (tmp_path / "o" / "runs" / "r0.json").exists()


def test_a_resume_command_whose_shell_cannot_find_its_program(
    tmp_path: Path, no_leftovers: None
) -> None:
    p = probe(tmp_path / "o", "--harness", fake("resume-127"), "--runs", "3")
    assert p.code == 2, p.stdout + p.stderr
    assert _error(p.stderr).endswith(
        "the resume command cannot start (exit 127: resume: 1: exec: no-such-harness-program: "
        "not found)")  # fmt: skip
    # found by the one try on the uninterrupted run's state: no planned run was made
    assert sorted(x.name for x in (tmp_path / "o" / "runs").glob("r*.json")) == [
        "r0.json", "r0.requests.json"]  # fmt: skip


def test_a_program_of_the_recipe_that_is_not_there_or_not_executable(tmp_path: Path) -> None:
    d = tmp_path / "r"
    d.mkdir()
    tail = '[tool]\nname = "bash"\n'
    (d / "recipe.toml").write_text(
        f'name = "x"\nlaunch = ["{{python}}", "{{recipe_dir}}/missing.py"]\n{tail}'
    )
    p = probe(tmp_path / "o", "--harness", str(d))
    assert p.code == 2 and "missing.py, which is not there" in _error(p.stderr), p.stderr
    script = d / "agent"
    script.write_text("#!/bin/sh\nexit 0\n")  # not executable
    (d / "recipe.toml").write_text(f'name = "x"\nlaunch = ["{{recipe_dir}}/agent"]\n{tail}')
    p = probe(tmp_path / "o2", "--harness", str(d))
    assert p.code == 2, p.stdout + p.stderr
    assert _error(p.stderr).endswith(f"the launch program {script} is not executable")
