"""The lab must catch a broken adapter: a build that reruns a command its ledger says
already exited (``DS_MUTANTS=rerun_exited``) applies a shell step twice. An exhaustive
campaign must fail it, print a repro command, and that command must fail again; the same
command on the correct build must pass."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _cli(args: list[str], cwd: Path, mutant: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("DS_MUTANTS", None)
    if mutant:
        env["DS_MUTANTS"] = "rerun_exited"
    return subprocess.run(
        [sys.executable, "-m", "durable_spaces.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_rerun_of_an_exited_command_is_caught_and_reproduced(tmp_path: Path) -> None:
    out = tmp_path / "campaign"
    args = ["campaign", "--mode", "exhaustive", "--backend", "local", "--calls", "3",
            "--seed-base", "mut1", "--jobs", "2", "--out", str(out), "--no-progress",
            "--no-report", "--retries", "1"]  # fmt: skip
    broken = _cli(args, tmp_path, mutant=True)
    assert broken.returncode != 0, broken.stdout[-2000:]
    lines = broken.stdout.splitlines()
    summary = lines[-1]
    assert summary.startswith("SUMMARY mode=exhaustive backend=local ")
    assert " failed=0 " not in summary
    repros = [ln for ln in lines if ln.startswith("REPRO ") and "(exact)" not in ln]
    reproduced = {ln.split()[1]: ln for ln in lines if ln.startswith("REPRODUCED ")}
    assert repros and all("exactly_once" in ln for ln in repros), repros
    # A kill right after the command exited is where the defect always shows, and its
    # repro fails again every time. Other points may catch it too, depending on whether
    # the command outlived its driver (a slower machine: it did not): a repro of such a
    # run may go another way, and then it must say so rather than pass as reproduced.
    at_exit = [ln for ln in repros if "adapter.exit-" in ln]
    assert at_exit, repros
    for ln in at_exit:
        assert reproduced[ln.split()[1]].split()[2] == "1/1", reproduced
    for run, ln in reproduced.items():
        assert ln.split()[2] == "1/1" or "the interleavings differ" in ln, (run, ln)
    command = shlex.split(at_exit[0].split(": ", 1)[1])
    # the printed command names the mutant it ran with: pasted alone, it fails again
    assert command[:4] == ["env", "DS_MUTANTS=rerun_exited", "durable-spaces", "repro"]
    command = command[2:]

    again = _cli([*command[1:], "--state-dir", str(tmp_path / "repro-broken")], tmp_path, True)
    assert again.returncode == 1, again.stdout[-2000:]
    assert "outcome=failed" in again.stdout.splitlines()[-1]

    # the same seed and schedule on the correct build (the mutant's variable left out)
    fixed = _cli([*command[1:], "--state-dir", str(tmp_path / "repro-fixed")], tmp_path, False)
    assert fixed.returncode == 0, fixed.stdout[-2000:]
