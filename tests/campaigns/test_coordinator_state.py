"""The coordinator's durable state file (``drive/coordinator_state.py``) with real
processes: epochs only grow (past a fenced floor, past a burned epoch), a driver is
recorded only under the epoch still current, a live driver of another coordinator
supersedes, and an orphan (its coordinator dead) is killed before the next epoch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from durable_spaces.drive.coordinator import read_state
from durable_spaces.drive.coordinator_state import STATE_FILE, StateFile, process_alive


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _none(epoch: int, pid: int) -> None:
    raise AssertionError(f"no orphan expected (epoch {epoch}, pid {pid})")


def test_epochs_grow_past_the_floor_and_past_a_burned_epoch(tmp_path: Path) -> None:
    a = StateFile(tmp_path, "s", "coordinator-a")
    assert [a.issue(0, True, _none) for _ in range(2)] == [1, 2]
    assert a.issue(10, True, _none) == 11  # a fence's floor seen: past it
    # a coordinator that died after issuing (epoch 11 burned, no driver recorded): its
    # successor never issues 11 again
    b = StateFile(tmp_path, "s", "coordinator-b")
    assert b.issue(0, True, _none) == 12
    assert read_state(tmp_path) == {"session": "s", "last_epoch": 12, "driver": None}


def test_a_driver_is_recorded_only_under_the_current_epoch_and_supersedes(
    tmp_path: Path,
) -> None:
    old, new = _sleeper(), _sleeper()
    try:
        a = StateFile(tmp_path, "s", "coordinator-a")
        b = StateFile(tmp_path, "s", "coordinator-b")
        e1 = a.issue(0, False, _none)
        e2 = b.issue(0, False, _none)  # b took over before a recorded its driver
        a.record_driver(e1, old.pid)
        assert read_state(tmp_path)["driver"] is None
        b.record_driver(e2, new.pid)
        assert read_state(tmp_path)["driver"]["pid"] == new.pid
        assert a.superseded(e1)  # a newer epoch, another coordinator's, alive
        assert not b.superseded(e2)
        new.kill()
        new.wait()
        assert not a.superseded(e1)  # the newer driver is dead: nothing to defer to
    finally:
        for p in (old, new):
            p.kill()
            p.wait()


def test_an_orphan_is_killed_before_the_next_epoch(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    orphan = _sleeper()
    try:
        state = {"session": "s", "last_epoch": 4, "driver": {
            "epoch": 4, "pid": orphan.pid, "create_time": None,
            "coordinator_pid": int(gone.stdout), "coordinator_ctime": None,
            "coordinator_id": "dead",
        }}  # fmt: skip
        (tmp_path / STATE_FILE).write_text(json.dumps(state))
        killed: list[tuple[int, int]] = []
        kept = StateFile(tmp_path, "s", "successor")
        assert kept.issue(0, False, _none) == 5  # kill_orphans=False: left to the fence
        assert process_alive(orphan.pid, None)
        (tmp_path / STATE_FILE).write_text(json.dumps(state))
        assert kept.issue(0, True, lambda e, p: killed.append((e, p))) == 5
        assert killed == [(4, orphan.pid)]
        assert orphan.wait(timeout=10) == -9
    finally:
        orphan.kill()
        orphan.wait()
