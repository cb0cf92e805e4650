"""``.ci/campaigns.sh`` and its functions (``.ci/lib.sh``): a campaign passes only if it
exits 0 and its SUMMARY line says it ran and its kills landed; a missing capability is
a skip outside CI and a failure on CI. Stand-in campaign commands say what a campaign
would print; one real campaign without a fault shows the rule on the real thing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = (
    "SUMMARY mode=transactional backend=local runs=4 ok=4 failed=0 lab_errors=0 kills=3 "
    "planned_kills=14 faults=failpoint:3 recoveries=ran:3 resume_p50_ms=80 resume_p95_ms=90 "
    "seed_base=ci"
)


def _standin(tmp: Path, stdout: str, rc: int, name: str = "standin") -> Path:
    """A campaign command that prints ``stdout`` and exits ``rc``, whatever it is asked."""
    (tmp / f"{name}.out").write_text(stdout)
    script = tmp / name
    script.write_text(f"#!/bin/sh\ncat '{tmp / f'{name}.out'}'\nexit {rc}\n")
    script.chmod(0o755)
    return script


def _bash(tmp: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("CI")}
    e.update(CI_CAMPAIGNS_OUT=str(tmp / "out"), **env)
    return subprocess.run(["bash", "-c", f"set -euo pipefail\n. .ci/lib.sh\n{script}"],
                          cwd=ROOT, env=e, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def _one(tmp: Path, stdout: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
    cmd = str(_standin(tmp, stdout, rc))
    return _bash(tmp, "ci_run c1 --runs 4\nci_recap\nexit $ci_status", CI_CAMPAIGN_CMD=cmd)


@pytest.mark.parametrize("summary", [GOOD, f"{GOOD} killed_at=25/25"], ids=["drawn", "exhaustive"])
def test_a_campaign_that_ran_and_landed_its_kills_passes(tmp_path: Path, summary: str) -> None:
    r = _one(tmp_path, f"REPRO nothing\n{summary}\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAILED" not in r.stdout
    assert (tmp_path / "out" / "c1.stdout").read_text().endswith(summary + "\n")


@pytest.mark.parametrize(
    ("stdout", "rc", "says"),
    [
        (GOOD.replace("runs=4 ok=4", "runs=0 ok=0"), 0, "runs=0"),
        (
            GOOD.replace(
                "kills=3 planned_kills=14 faults=failpoint:3", "kills=0 planned_kills=0 faults=-"
            ),
            0,
            "no fault landed",
        ),
        (GOOD.replace("kills=3 ", "kills=0 "), 0, "kills=0 short of planned_kills=14"),
        (GOOD.replace("planned_kills=14 ", ""), 0, "SUMMARY field planned_kills is missing"),
        (GOOD.replace("kills=3 ", "kills=three "), 0, "SUMMARY field kills is missing or not"),
        (GOOD.replace("ok=4", "ok=9"), 0, "SUMMARY ok+failed+lab_errors is not runs"),
        (GOOD.replace("ok=4 failed=0", "ok=3 failed=1"), 0, "exit 0 but the SUMMARY counts"),
        (f"{GOOD}\nsomething after it\n", 0, "no SUMMARY line last"),
        ("", 0, "no SUMMARY line last"),
        (f"UNTESTED ran no run\n{GOOD}\n", 4, "exited 4 (UNTESTED ran no run)"),
        (GOOD, 1, "exited 1"),
        (f"{GOOD} killed_at=24/25", 0, "killed at 24 of the 25 killable failpoints"),
        (f"{GOOD} killed_at=all", 0, "SUMMARY field killed_at is not K/N"),
    ],
    ids=[
        "no-run",
        "no-fault",
        "kills-short",
        "doctored-field-gone",
        "doctored-count",
        "doctored-sum",
        "failed-yet-exit-0",
        "summary-not-last",
        "no-summary",
        "untested",
        "failed",
        "exhaustive-short",
        "exhaustive-doctored",
    ],
)
def test_a_campaign_that_tested_nothing_or_doctored_its_summary_fails(
    tmp_path: Path, stdout: str, rc: int, says: str
) -> None:
    r = _one(tmp_path, stdout + ("\n" if stdout else ""), rc)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"== FAILED c1: {says}" in r.stdout, r.stdout


def test_a_real_campaign_without_a_fault_fails_it(tmp_path: Path) -> None:
    r = _bash(tmp_path, "ci_run calm --backend local --runs 2 --calls 2 --seed-base ci-calm "
              "--profile calm --no-report\nci_recap\nexit $ci_status",
              PYTHONPATH=str(ROOT))  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert "SUMMARY mode=transactional backend=local runs=2 ok=2 failed=0" in r.stdout
    assert "== FAILED calm: no fault landed (kills=0 faults=-)" in r.stdout, r.stdout


@pytest.mark.parametrize("ci", [None, "true"])
def test_a_missing_capability_is_skipped_outside_ci_and_fails_on_ci(
    tmp_path: Path, ci: str | None
) -> None:
    probe = _standin(tmp_path, "fuse: /dev/fuse is not a character device\n", 1, "probe")
    env = {"CI_CAPABILITIES_CMD": str(probe)} | ({"CI": ci} if ci else {})
    r = _bash(tmp_path, "if ci_require power fuse; then echo RAN; fi\nci_recap\n"
              "exit $ci_status", **env)  # fmt: skip
    assert "RAN" not in r.stdout
    if ci is None:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "== power campaigns skipped: fuse: /dev/fuse is not a character device" in r.stdout
    else:
        assert r.returncode == 1, r.stdout + r.stderr
        assert (
            "== FAILED power: CI requires it, and it is missing: fuse: /dev/fuse is not a "
            "character device" in r.stdout
        )


@pytest.mark.parametrize("good", [True, False], ids=["passes", "fails"])
def test_the_script_runs_the_campaigns_it_is_told_to_and_judges_them(
    tmp_path: Path, good: bool
) -> None:
    cmd = _standin(tmp_path, (GOOD if good else GOOD.replace("runs=4 ok=4", "runs=0 ok=0")), 0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CI")}
    env.update(CI_CAMPAIGNS_OUT=str(tmp_path / "out"), CI_CAMPAIGN_CMD=str(cmd),
               CI_CAPABILITIES_CMD="true", CI_CAMPAIGNS_ONLY="auto-local")  # fmt: skip
    r = subprocess.run(["bash", ".ci/campaigns.sh"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    ran = [ln for ln in r.stdout.splitlines() if ln.startswith("== campaign ")]
    assert ran == ["== campaign auto-local"], r.stdout
    assert r.returncode == (0 if good else 1), r.stdout + r.stderr
