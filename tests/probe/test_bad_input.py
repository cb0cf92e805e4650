"""A harness the probe cannot test is one line (exit 2) and leaves nothing running."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_spaces.probe.faults import KEEP_BYTES, HarnessProcess
from durable_spaces.probe.recipe import load
from durable_spaces.probe.runner import ProbeRun, run_one
from tests.probe.helpers import probe, write_recipe


def _one_error(stderr: str) -> str:
    (line,) = [x for x in stderr.splitlines() if x.startswith("durable-spaces:")]
    return line


@pytest.mark.parametrize(
    ("defect", "extra", "says"),
    [
        ("none", ["--tool-name", "shell"], "harness fake-test: the harness offers the model the "
         "tools [shell]: the recipe's tool 'bash' is not among them"),
        ("loop", [], "harness fake-test exited 0 without calling the model"),
        ("responses", [], "harness fake-test: the harness asked POST /v1/responses; the "
         "scripted model answers only Chat Completions"),
    ],
)  # fmt: skip
def test_what_the_probe_cannot_test(tmp_path: Path, defect: str, extra: list[str], says: str,
                                    no_leftovers: None) -> None:  # fmt: skip
    recipe = write_recipe(tmp_path / "r", defect, extra)
    p = probe(tmp_path / "o", "--harness", str(recipe), "--steps", "1")
    assert p.code == 2, p.stdout + p.stderr
    assert _one_error(p.stderr).startswith(f"durable-spaces: error: {says}")


def test_a_harness_not_installed(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r", "none",
                          available='["{python}", "-c", "import no_such_module_here"]')  # fmt: skip
    p = probe(tmp_path / "o", "--harness", str(recipe))
    assert p.code == 2
    assert "harness fake-test is not installed" in _one_error(p.stderr)
    assert "No module named 'no_such_module_here'" in p.stderr


def test_a_flood_of_output_is_capped(tmp_path: Path) -> None:
    flood = "head -c 30000000 /dev/zero | tr '\\0' x; echo; echo last words"
    a = HarnessProcess(["sh", "-c", flood], tmp_path, {"PATH": "/usr/bin:/bin"}, None)
    assert a.wait() == 0
    out = a.output()
    assert len(out) < 3 * KEEP_BYTES and "bytes left out" in out
    assert a.last_line() == "last words"


def test_a_flooding_harness_still_runs(tmp_path: Path) -> None:
    r = load(str(write_recipe(tmp_path / "r", "flood")))
    rec = run_one(ProbeRun(recipe=r, run_id="r0", seed="t-0", scenario="random",
                          fault="process", steps=1, point=None, work=tmp_path / "w",
                          runs_dir=tmp_path / "runs", use_cgroup=False))  # fmt: skip
    assert rec.outcome == "ok" and [x.cls for x in rec.results] == ["once"]
