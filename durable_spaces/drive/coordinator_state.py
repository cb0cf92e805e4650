"""The coordinator's durable state file, and epoch issuance through it.

``<state_dir>/coordinator.json`` holds the last epoch issued and the driver running under
it (pid and process start time, and the same for the coordinator that launched it). It
is written under an ``fcntl`` lock on ``coordinator.lock``, to a temporary file, fsynced,
renamed, directory fsynced: an epoch is durable *before* any driver runs under it, so a
coordinator killed between the write and the spawn burns that epoch and its successor
never issues it again. A recorded driver whose coordinator is dead is an orphan; one whose
coordinator is alive (another one, or another in this process) supersedes older epochs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

from durable_spaces.chaos import failpoints, points
from durable_spaces.host.bounded import load_object
from durable_spaces.host.proc_start import started

STATE_FILE = "coordinator.json"
LOCK_FILE = "coordinator.lock"


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_state(state_dir: str | Path) -> dict[str, Any]:
    """The coordinator file (``{"last_epoch": 0}`` when there is none yet)."""
    p = Path(state_dir) / STATE_FILE
    try:
        data: dict[str, Any] = load_object(p)  # a FIFO, a huge or deep file: refused
    except FileNotFoundError:
        return {"last_epoch": 0, "driver": None}
    return data


def _write_state(state_dir: Path, data: Mapping[str, Any]) -> None:
    tmp = state_dir / f".{STATE_FILE}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state_dir / STATE_FILE)
    dfd = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def process_alive(pid: int, create_time: float | None) -> bool:
    """Alive and the same process (a reused pid has another start time)."""
    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(started(pid) - create_time) > 0.05:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _my_ctime() -> float | None:
    try:
        return started(os.getpid())
    except psutil.Error:
        return None


def _kill_and_reap(pid: int, create_time: float | None, timeout: float = 10.0) -> None:
    """SIGKILL a process that is not our child and wait until it is dead (a zombie left
    for a parent that does not reap counts as dead: it runs nothing)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + timeout
    while process_alive(pid, create_time) and time.monotonic() < end:
        time.sleep(0.01)


class StateFile:
    """One coordinator's view of ``<state_dir>/coordinator.json``; ``coordinator_id``
    tells its drivers apart from any other coordinator's (even one in this process)."""

    def __init__(self, state_dir: Path, session_name: str, coordinator_id: str) -> None:
        self.dir = state_dir
        self.session_name = session_name
        self.coordinator_id = coordinator_id

    def _ours(self, drv: Mapping[str, Any]) -> bool:
        return drv.get("coordinator_id") == self.coordinator_id

    def issue(self, floor: int, kill_orphans: bool, on_orphan: Callable[[int, int], None]) -> int:
        """Persist the next epoch, ``max(last issued, floor) + 1``, before anything runs
        under it. With ``kill_orphans``, a recorded driver whose coordinator is dead is
        SIGKILLed and reaped first (``on_orphan(epoch, pid)`` is told)."""
        with _locked(self.dir):
            st = read_state(self.dir)
            drv = st.get("driver")
            if (
                kill_orphans
                and drv
                and not self._ours(drv)
                and not process_alive(int(drv["coordinator_pid"]), drv.get("coordinator_ctime"))
                and process_alive(int(drv["pid"]), drv.get("create_time"))
            ):
                _kill_and_reap(int(drv["pid"]), drv.get("create_time"))
                on_orphan(int(drv["epoch"]), int(drv["pid"]))
            epoch = max(int(st.get("last_epoch", 0)), floor) + 1
            st = {"session": self.session_name, "last_epoch": epoch, "driver": None}
            _write_state(self.dir, st)
        failpoints.hit(points.COORDINATOR_EPOCH_ISSUED)
        return epoch

    def record_driver(self, epoch: int, pid: int) -> None:
        """Record the driver spawned under ``epoch``, unless a newer epoch was issued."""
        try:
            ctime: float | None = started(pid)
        except psutil.Error:
            ctime = None
        with _locked(self.dir):
            st = read_state(self.dir)
            if int(st.get("last_epoch", 0)) != epoch:
                return  # another coordinator issued a newer epoch meanwhile
            st["driver"] = {
                "epoch": epoch,
                "pid": pid,
                "create_time": ctime,
                "coordinator_pid": os.getpid(),
                "coordinator_ctime": _my_ctime(),
                "coordinator_id": self.coordinator_id,
            }
            _write_state(self.dir, st)
        failpoints.hit(points.COORDINATOR_DRIVER_RECORDED)

    def superseded(self, epoch: int) -> bool:
        """A newer epoch is issued and its driver, another coordinator's, is alive."""
        st = read_state(self.dir)
        drv = st.get("driver")
        return bool(
            int(st.get("last_epoch", 0)) > epoch
            and drv
            and not self._ours(drv)
            and process_alive(int(drv["pid"]), drv.get("create_time"))
        )
