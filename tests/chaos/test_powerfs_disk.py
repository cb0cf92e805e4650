"""powerfs's slow disk (``chaos/powerfs/disk.py``) against the real kernel FUSE: a stalled
fsync really blocks its caller, returns when the stall ends with its data durable, and
fails at a cut during the stall with its data lost; a latency delays each durability call
and survives a cut; bad values are refused with a clear error.

The fsyncs run in child processes: a caller held by a stall cannot be killed (it waits
in the kernel), and a test process stuck that way would hang the suite.
"""

from __future__ import annotations

import errno
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_spaces.chaos.powerfs import PowerFSError
from durable_spaces.chaos.powerfs.api import _call
from durable_spaces.errors import ConfigError
from tests.chaos.test_powerfs import Mnt, durable_file, write

pytestmark = pytest.mark.fuse  # skipped without FUSE, failed on CI (tests/needs.py)

#: A child that fsyncs ``path`` and prints the errno it got (0) and how long it took.
_FSYNC = (
    "import os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "t = time.monotonic()\n"
    "try:\n"
    "    os.fsync(fd); e = 0\n"
    "except OSError as x:\n"
    "    e = x.errno\n"
    "print(e, time.monotonic() - t, flush=True)\n"
)


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Mnt]:
    m = Mnt(tmp_path)
    yield m
    m.fs.resume()  # nothing stays held past a failed test
    m.close()


def _fsync_child(path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _FSYNC, str(path)], stdout=subprocess.PIPE, text=True
    )


def _until_held(m: Mnt, pid: int) -> None:
    deadline = time.monotonic() + 30
    while pid not in m.fs.disk().held_pids:
        assert time.monotonic() < deadline, "the fsync was never held by the stall"
        time.sleep(0.02)


def _result(child: subprocess.Popen[str]) -> tuple[int, float]:
    out, _ = child.communicate(timeout=60)
    err, took = out.split()
    return int(err), float(took)


def _durable(m: Mnt, name: str) -> bytes:
    return (m.backing / name).read_bytes()


def test_a_stalled_fsync_blocks_until_resume_and_its_data_is_durable(mnt: Mnt) -> None:
    p = durable_file(mnt, "f", b"old")
    write(p, b"new data")  # volatile
    state = mnt.fs.stall(120)
    assert state.stalled and state.stalls == 1
    child = _fsync_child(p)
    _until_held(mnt, child.pid)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:  # held: still inside the fsync
        assert child.poll() is None
        time.sleep(0.05)
    assert _durable(mnt, "f") == b"old"  # nothing made durable while held
    write(mnt.root / "plain", b"x")  # a plain write is not held (the page cache takes it)
    assert mnt.fs.resume().held_calls == 1
    assert _result(child)[0] == 0
    assert _durable(mnt, "f") == b"new data"
    mnt.fs.cut()
    assert p.read_bytes() == b"new data"


def test_a_stall_ends_by_itself_at_its_deadline(mnt: Mnt) -> None:
    p = durable_file(mnt, "f", b"old")
    write(p, b"new")
    t0 = time.monotonic()
    mnt.fs.stall(1.5)
    child = _fsync_child(p)
    err, _ = _result(child)
    assert err == 0
    assert time.monotonic() - t0 >= 1.5  # it was held until the deadline
    assert not mnt.fs.disk().stalled
    assert _durable(mnt, "f") == b"new"


def test_a_cut_during_a_stall_fails_the_held_fsync_and_drops_its_data(mnt: Mnt) -> None:
    p = durable_file(mnt, "f", b"old")
    write(p, b"never durable")
    mnt.fs.stall(120)
    child = _fsync_child(p)
    _until_held(mnt, child.pid)
    report = mnt.fs.cut()
    assert report.held == 1
    assert _result(child)[0] in (errno.ECONNABORTED, errno.ENOTCONN)
    assert p.read_bytes() == b"old"
    state = mnt.fs.disk()  # the new boot's disk is not stalled
    assert not state.stalled and state.held == 0
    write(p, b"after", sync="fsync")
    assert _durable(mnt, "f") == b"after"


def test_keep_stuck_serves_new_calls_while_the_held_ones_wait(mnt: Mnt) -> None:
    a = durable_file(mnt, "a", b"a0")
    b = durable_file(mnt, "b", b"b0")
    write(a, b"a1")
    mnt.fs.stall(120)
    stuck = _fsync_child(a)
    _until_held(mnt, stuck.pid)
    mnt.fs.resume(keep_stuck=True)
    write(b, b"b1", sync="fsync")  # served at once
    assert _durable(mnt, "b") == b"b1"
    assert stuck.poll() is None and mnt.fs.disk().held == 1
    mnt.fs.resume()
    assert _result(stuck)[0] == 0
    assert _durable(mnt, "a") == b"a1"


def test_latency_delays_each_durability_call_and_survives_a_cut(mnt: Mnt) -> None:
    p = durable_file(mnt, "f", b"x")
    assert mnt.fs.latency(300).fsync_ms == 300
    _, took = _result(_fsync_child(p))
    assert took >= 0.3
    mnt.fs.cut()
    state = mnt.fs.disk()
    assert state.fsync_ms == 300  # the disk's, not the boot's
    _, took = _result(_fsync_child(p))
    assert took >= 0.3 and mnt.fs.disk().delayed_calls == 1
    mnt.fs.latency(0)


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, 1e9, "1", True, None])
def test_bad_stall_and_latency_values_are_refused(mnt: Mnt, bad: object) -> None:
    with pytest.raises(ConfigError, match="stall seconds"):
        mnt.fs.stall(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="fsync latency ms"):
        mnt.fs.latency(bad)  # type: ignore[arg-type]
    # the server checks too: a raw request past the handle's check gets a typed error
    with pytest.raises(PowerFSError, match="stall seconds"):
        _call(mnt.fs.state_dir, {"cmd": "stall", "seconds": bad})
    assert not mnt.fs.disk().stalled
    assert json.dumps(mnt.fs.disk().__dict__)  # the mount still answers
    assert os.path.ismount(mnt.root)


def test_the_cli_stalls_and_refuses_a_bad_value(mnt: Mnt) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "durable_spaces.chaos.powerfs", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    sd = mnt.fs.state_dir
    ok = cli("stall", sd, "30")
    assert ok.returncode == 0 and json.loads(ok.stdout)["stalled"] is True
    assert json.loads(cli("resume", sd).stdout)["stalled"] is False
    bad = cli("latency", sd, "-3")
    assert bad.returncode == 1 and "fsync latency ms must be between" in bad.stderr
    assert "Traceback" not in bad.stderr
