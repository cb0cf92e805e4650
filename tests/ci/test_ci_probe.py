"""``.ci/lib.sh``'s ``ci_probe``: a probe in CI passes only if its SUMMARY says it ran,
its kills landed, the lab broke nothing, and the grade is the one expected (exactly, or
"X-or-better"). Stand-in probe commands say what a probe would print."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _line(**over: str) -> str:
    f = {"harness": "h", "runs": "18", "steps": "54", "once": "48", "duplicate": "6",
         "lost": "0", "phantom": "0", "reported": "0", "orphan": "0", "stuck": "0",
         "lab_errors": "0", "kills": "17", "pairs": "5/17", "grade": "at-least-once",
         "seed_base": "probe"}  # fmt: skip
    f.update(over)
    return "SUMMARY probe " + " ".join(f"{k}={v}" for k, v in f.items() if v != "-")


def _probe(tmp: Path, stdout: str, want: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
    (tmp / "out.txt").write_text(stdout)
    standin = tmp / "probe"
    standin.write_text(f"#!/bin/sh\ncat '{tmp / 'out.txt'}'\nexit {rc}\n")
    standin.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CI")}
    env.update(CI_CAMPAIGNS_OUT=str(tmp / "out"), CI_PROBE_CMD=str(standin))
    script = f"set -euo pipefail\n. .ci/lib.sh\nci_probe p {want} --harness h\nexit $ci_status"
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_the_expected_grade_passes(tmp_path: Path) -> None:
    assert _probe(tmp_path, _line() + "\n", "at-least-once").returncode == 0
    assert _probe(tmp_path, _line(grade="unverified") + "\n", "unverified").returncode == 0


@pytest.mark.parametrize(
    ("stdout", "want", "why"),
    [
        (_line(grade="exactly-once"), "at-least-once", "expected at-least-once"),
        (_line(grade="unsafe"), "at-least-once", "expected at-least-once"),
        (_line(grade="unsafe"), "at-most-once-reported-or-better", "worse than"),
        (_line(runs="1", kills="0"), "at-least-once", "tested no crash"),
        (_line(kills="0"), "at-least-once", "tested no crash"),
        (_line(lab_errors="2"), "at-least-once", "lab broke"),
        (_line(grade="great"), "at-least-once", "is not a grade"),
        (_line(grade="partial:at-least-once"), "at-least-once", "covered only 5/17"),
        (_line(grade="unverified"), "at-least-once-or-better", "worse than"),
        (_line(kills="-"), "at-least-once", "kills is missing"),
        (_line() + "\nsomething after", "at-least-once", "no probe SUMMARY line last"),
        ("", "at-least-once", "no probe SUMMARY line last"),
    ],
)
def test_a_probe_that_did_not_test_what_it_must_fails(
    tmp_path: Path, stdout: str, want: str, why: str
) -> None:
    r = _probe(tmp_path, stdout + "\n", want)
    assert r.returncode == 1 and why in r.stdout, r.stdout + r.stderr


def test_or_better_takes_a_better_grade_and_an_exit_1_fails(tmp_path: Path) -> None:
    good = _line(grade="exactly-once")
    assert _probe(tmp_path, good, "at-most-once-reported-or-better").returncode == 0
    r = _probe(tmp_path, _line(), "at-least-once", rc=1)
    assert r.returncode == 1 and "exited 1" in r.stdout
