"""The lab must catch a checkpoint that misses its call's change though the next one
heals it (``DS_MUTANTS=checkpoint_misses_call``: every other checkpoint holds the files
as the one before did): checkpoint mode's blind spot. With no fault the
last checkpoint agrees with the workspace and the workspace with the log, so only
``checkpoint_follows_calls`` (every call's checkpoint, read from the store) fails; the
same campaign on the correct build passes with every call checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _campaign(out: Path, mutant: bool, profile: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("DS_MUTANTS", None)
    if mutant:
        env["DS_MUTANTS"] = "checkpoint_misses_call"
    args = ["campaign", "--mode", "checkpoint", "--backend", "local", "--runs", "2",
            "--calls", "6", "--seed-base", "cpmiss", "--profile", profile, "--jobs", "2",
            "--out", str(out), "--no-progress", "--no-report", "--retries", "0"]  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "durable_spaces.cli", *args],
        cwd=out.parent, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _checks(out: Path) -> list[dict[str, dict[str, object]]]:
    return [json.loads(p.read_text())["checks"] for p in sorted((out / "runs").glob("*.json"))]


def test_a_call_s_checkpoint_that_misses_its_change_is_caught_though_the_end_agrees(
    tmp_path: Path,
) -> None:
    broken = _campaign(tmp_path / "broken", mutant=True, profile="calm")
    assert broken.returncode == 1, broken.stdout[-2000:] + broken.stderr[-2000:]
    assert " failed=0 " not in broken.stdout.splitlines()[-1]
    runs = _checks(tmp_path / "broken")
    caught = [
        c for c in runs
        if c["checkpoint_follows_calls"]["valid"] is False
        and c["checkpoint_equals_workspace"]["valid"] is True
        and c["workspace_equals_log"]["valid"] is True
    ]  # fmt: skip
    assert caught, json.dumps(runs, indent=1)[:3000]
    assert "call_not_in_checkpoint" in str(caught[0]["checkpoint_follows_calls"]["detail"])
    fixed = _campaign(tmp_path / "fixed", mutant=False, profile="calm")
    assert fixed.returncode == 0, fixed.stdout[-2000:]
    for c in _checks(tmp_path / "fixed"):
        v = c["checkpoint_follows_calls"]
        assert v["valid"] is True and str(v["detail"]).startswith("6 committed calls"), v
