"""The one way tests declare what they need (``tests/needs.py``): outside CI a test that
lacks it skips, saying what is missing; on CI (``CI=true``) it fails with the reason,
and a skip for any other reason stays a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from durable_spaces.campaigns import capabilities
from durable_spaces.campaigns.capabilities import CAPABILITIES, required

CASE = Path(__file__).with_name("capability_case.py")


def _pytest(ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    argv = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider",
            "-v", "-rsfE", "-W", "ignore::pytest.PytestUnknownMarkWarning", str(CASE)]  # fmt: skip
    return subprocess.run(argv, cwd=CASE.parents[2], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def _outcomes(r: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """test name -> PASSED, SKIPPED, or FAILED (a failure or an error), from ``-v``."""
    out: dict[str, str] = {}
    for line in r.stdout.splitlines():
        if not line.startswith("tests/ci/capability_case.py::"):
            continue
        name, _, rest = line.removeprefix("tests/ci/capability_case.py::").partition(" ")
        word = rest.split(" ")[0]
        out[name] = "FAILED" if word == "ERROR" else word
    return out


def test_outside_ci_a_missing_capability_is_a_skip_that_says_what_is_missing() -> None:
    r = _pytest(None)
    got = _outcomes(r)
    assert r.returncode == 0, r.stdout[-3000:]
    assert got["test_calls_need"] == got["test_is_marked"] == "SKIPPED", r.stdout[-3000:]
    assert "needs absent: no machine has it" in r.stdout
    assert got["test_skips_for_a_reason_of_its_own"] == "SKIPPED"


def test_on_ci_a_missing_capability_fails_the_run_with_its_reason() -> None:
    r = _pytest("true")
    got = _outcomes(r)
    assert r.returncode == 1, r.stdout[-3000:]
    assert got["test_calls_need"] == got["test_is_marked"] == "FAILED", r.stdout[-3000:]
    assert "CI (CI=true) requires every capability; needs absent: no machine has it" in r.stdout
    # a skip for a reason of the test's own is no missing capability: still a skip
    assert got["test_skips_for_a_reason_of_its_own"] == "SKIPPED", r.stdout[-3000:]
    fuse = capabilities.capability("fuse").missing()
    assert got["test_needs_what_this_machine_may_have"] == ("PASSED" if fuse is None else "FAILED")


def test_the_list_is_data_and_ci_is_what_requires_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert {"fuse", "netns", "postgres", "spacesd", "docker", "microvm"} <= set(CAPABILITIES)
    assert required({"CI": "true"}) and not required({}) and not required({"CI": "false"})
    assert capabilities.main(["no-such"]) == 2
    assert "unknown capability 'no-such'" in capsys.readouterr().err
