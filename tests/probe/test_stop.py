"""A probe stopped by ^C leaves nothing of its runs running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from durable_spaces.host.cgroup import cgroup_root
from durable_spaces.probe.record import ProbeRecord
from tests.probe.helpers import run_processes, write_recipe


def test_interrupted_probe_leaves_nothing(tmp_path: Path) -> None:
    """^C while a planned run is surely under way: one of its attempts, resumed after its
    kill, holds until it is killed (``--hold``) and says so; ^C comes after that."""
    out, held = tmp_path / "o", tmp_path / "held"
    held.mkdir()
    recipe = write_recipe(tmp_path / "recipe", "none", extra=["--hold", str(held)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_spaces.cli", "probe", "--harness", str(recipe.parent),
         "--runs", "8", "--steps", "3", "--out", str(out), "--no-report"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy(),
    )  # fmt: skip
    while not any(held.iterdir()):  # a planned run's resumed attempt holds
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait() != 0
    assert run_processes(tmp_path) == []
    # the runs under way were stopped, not resumed to their end
    planned = [ProbeRecord.load(p) for p in (out / "runs").glob("r*.json")
               if p.name != "r0.json" and not p.name.endswith(".requests.json")]  # fmt: skip
    assert any(r.outcome == "stuck" for r in planned), [r.outcome for r in planned]
    root = cgroup_root()
    if root is not None and root.is_dir():
        assert list(root.glob(f"probe-{proc.pid}-*")) == []
