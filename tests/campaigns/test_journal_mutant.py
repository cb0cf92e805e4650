"""The lab must catch a change journal that misses events (``DS_MUTANTS=journal_miss``:
appends to existing files never reach the image or the checkpoint): a short
transactional campaign on ``local`` fails it on the image-versus-workspace check, a
checkpoint campaign (whose journaled checkpoints then miss a call's append) on the
checkpoint-versus-workspace check, and the same campaigns on the correct build pass.
The journal that runs in the Space (``spacesd/guest_journal.pl``, a microvm's) the same
way, on the real cua-spacesd with the host scan off (``DS_HOST_SCAN=0``).
What the journal vouches for is therefore checked, not assumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from needs import need

pytestmark = pytest.mark.slow


def _campaign(
    out: Path, mutant: bool, mode: str = "transactional", backend: str = "local"
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("DS_MUTANTS", None)
    env.pop("DS_SPACE_JOURNAL", None)
    env["DS_HOST_SCAN"] = "0"  # spacesd: the journal in the Space (local has no other)
    if mutant:
        env["DS_MUTANTS"] = "journal_miss"
    args = ["campaign", "--mode", mode, "--backend", backend, "--runs", "4",
            "--calls", "8", "--seed-base", "jmiss", "--jobs", "2", "--out", str(out),
            "--no-progress", "--no-report", "--retries", "0"]  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "durable_spaces.cli", *args],
        cwd=out.parent, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize("backend", ["local", pytest.param("spacesd", marks=pytest.mark.spacesd)])
def test_a_journal_that_misses_events_is_caught_and_the_real_one_passes(
    tmp_path: Path, backend: str
) -> None:
    need(backend)
    broken = _campaign(tmp_path / "broken", mutant=True, backend=backend)
    summary = broken.stdout.splitlines()[-1]
    assert broken.returncode == 1, broken.stdout[-2000:]
    assert summary.startswith(f"SUMMARY mode=transactional backend={backend} ")
    assert " failed=0 " not in summary
    # the end's check (and the per-call one: the append is missing from its call's image)
    assert "(image_equals_workspace,image_follows_calls)" in broken.stdout, broken.stdout[-2000:]
    # a failed run's repro line names the switch and the mutant its path took
    repro = [
        ln for ln in broken.stdout.splitlines() if ln.startswith("REPRO ") and "(exact)" not in ln
    ]
    assert repro and all(
        ": env DS_HOST_SCAN=0 DS_MUTANTS=journal_miss durable-spaces repro " in ln for ln in repro
    ), repro
    fixed = _campaign(tmp_path / "fixed", mutant=False, backend=backend)
    # no run failed; whether the seeds' kills landed (exit 4, ``campaigns/earned.py``) is
    # the machine's timing on spacesd under load, and not what this test is about
    assert fixed.returncode in (0, 4), fixed.stdout[-2000:]
    assert " failed=0 lab_errors=0 " in fixed.stdout.splitlines()[-1]


def test_journaled_checkpoints_that_miss_events_are_caught_and_the_real_ones_pass(
    tmp_path: Path,
) -> None:
    broken = _campaign(tmp_path / "broken", mutant=True, mode="checkpoint")
    summary = broken.stdout.splitlines()[-1]
    assert broken.returncode == 1, broken.stdout[-2000:]
    assert summary.startswith("SUMMARY mode=checkpoint backend=local ")
    assert " failed=0 " not in summary
    assert "checkpoint_equals_workspace" in broken.stdout, broken.stdout[-2000:]
    fixed = _campaign(tmp_path / "fixed", mutant=False, mode="checkpoint")
    assert fixed.returncode == 0, fixed.stdout[-2000:]
    assert " failed=0 " in fixed.stdout.splitlines()[-1]


@pytest.mark.spacesd
def test_a_journal_that_trusts_a_lost_helper_is_caught_when_the_lab_kills_it(
    tmp_path: Path,
) -> None:
    """``journal_loss_trusted`` (the journal answers from what it knew when its helper is
    gone): a schedule that kills the helper where the driver stops at the second call's
    start (``adapter.start_mark``, so no timing decides it) has that call credited with
    nothing, and ``image_follows_calls`` names it (the end agrees: the next call folds
    the change in). The real build passes the schedule.

    Why a schedule and not a drawn seed: seed ``jkm-0`` restarts the Space at that point,
    and whether the restart breaks the driver's request (the driver halts, exit 1) or
    falls between two (the helper dies, the mutant shows) is the machine's timing."""

    need("spacesd")
    schedule = tmp_path / "schedule.json"
    kill = {"kind": "journal_kill", "n": 2, "point": "adapter.start_mark"}
    schedule.write_text(json.dumps({"seed": "jkm-0", "origin": "explicit", "attempts": [
        {"at_points": [kill], "failpoint": None, "faults": [], "kill_after_s": []}]}))  # fmt: skip

    def repro(mutant: bool) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DS_MUTANTS", "DS_SPACE_JOURNAL")}
        env["DS_HOST_SCAN"] = "0"
        if mutant:
            env["DS_MUTANTS"] = "journal_loss_trusted"
        args = ["repro", "--mode", "transactional", "--backend", "spacesd", "--seed", "jkm-0",
                "--calls", "8", "--profile", "space-journal", "--schedule", str(schedule),
                "--state-dir", str(tmp_path / ("broken" if mutant else "fixed"))]  # fmt: skip
        return subprocess.run(
            [sys.executable, "-m", "durable_spaces.cli", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip

    broken = repro(True)
    last = broken.stdout.splitlines()[-1]
    assert broken.returncode == 1, broken.stdout[-2000:]
    assert last == "RESULT seed=jkm-0 outcome=failed failing=image_follows_calls", last
    fixed = repro(False)
    assert fixed.returncode == 0, fixed.stdout[-2000:]
