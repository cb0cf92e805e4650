"""powerfs's crash points inside a program's writes (``chaos/powerfs/trap.py``) against the
real kernel FUSE: the n-th write, fsync or rename is held before it is made and announced
on a FIFO; released ``go`` it is made, ``fail`` it fails unmade (EIO), a cut ends it; every
operation is counted and traced. The writers are child processes: a caller held inside a
FUSE request cannot be killed until it is answered."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_spaces.chaos.powerfs import PowerFSError
from tests.chaos.test_powerfs import Mnt

pytestmark = pytest.mark.fuse  # skipped without FUSE, failed on CI (tests/needs.py)

#: A child that appends three lines to a file (one write each), fsyncs it, renames it, and
#: prints the errno of each operation (0: done).
_WRITER = (
    "import os, sys\n"
    "p = sys.argv[1]\n"
    "fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)\n"
    "def do(f, *a):\n"
    "    try:\n"
    "        f(*a); return 0\n"
    "    except OSError as e:\n"
    "        return e.errno\n"
    "out = [do(os.write, fd, f'line {i}\\n'.encode()) for i in (1, 2, 3)]\n"
    "out.append(do(os.fsync, fd))\n"
    "do(os.close, fd)\n"
    "out.append(do(os.rename, p, p + '.done'))\n"
    "print(*out, flush=True)\n"
)


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Mnt]:
    m = Mnt(tmp_path)
    yield m
    m.close()


def _announced(fifo: Path) -> tuple[threading.Thread, list[str]]:
    os.mkfifo(fifo)
    got: list[str] = []

    def read() -> None:
        with open(fifo) as f:
            got.append(f.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, got


def _writer(m: Mnt) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _WRITER, str(m.root / "j")],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip


@pytest.mark.parametrize(("verdict", "lines", "errnos"), [
    ("go", "line 1\nline 2\nline 3\n", "0 0 0 0 0"),
    ("fail", "line 1\nline 3\n", "0 5 0 0 0"),  # EIO, and the write never made
])  # fmt: skip
def test_the_nth_write_is_held_then_made_or_failed(
    mnt: Mnt, tmp_path: Path, verdict: str, lines: str, errnos: str
) -> None:
    reader, got = _announced(tmp_path / "held")
    mnt.fs.trap(arm=["write", 2], notify=str(tmp_path / "held"))
    child = _writer(mnt)
    reader.join(60)
    kind, n, pid, path = got[0].split()
    assert (kind, n, int(pid), path) == ("write", "2", child.pid, "/j")
    state = mnt.fs.trap()
    assert state["held"]["n"] == 2 and state["counts"]["write"] == 2
    assert child.poll() is None  # held: the call has not returned
    mnt.fs.trap(release=verdict)
    out, _ = child.communicate(timeout=60)
    assert out.split() == errnos.split()
    assert (mnt.root / "j.done").read_text() == lines
    trace = mnt.fs.trap(trace=True)
    assert trace["counts"] == {"write": 3, "fsync": 1, "rename": 1}
    assert [t[:2] for t in trace["trace"] if t[3]] == [
        ["write", 1], ["write", 2], ["write", 3], ["fsync", 1], ["rename", 1]]  # fmt: skip


def test_a_cut_ends_a_held_fsync_and_its_data_is_lost(mnt: Mnt, tmp_path: Path) -> None:
    reader, got = _announced(tmp_path / "held")
    mnt.fs.trap(arm=["fsync", 1], notify=str(tmp_path / "held"))
    child = _writer(mnt)
    reader.join(60)
    assert got and got[0].startswith("fsync 1 ")
    mnt.fs.cut()
    out, _ = child.communicate(timeout=60)
    assert out.split()[3] != "0"  # the fsync did not make anything durable
    assert not (mnt.root / "j").exists() and not (mnt.root / "j.done").exists()


def test_nobody_listening_lets_the_operation_go_and_bad_arms_are_refused(
    mnt: Mnt, tmp_path: Path
) -> None:
    mnt.fs.trap(arm=["rename", 1], notify=str(tmp_path / "nobody-reads-this"))
    child = _writer(mnt)
    out, _ = child.communicate(timeout=60)
    assert out.split() == ["0"] * 5 and mnt.fs.trap()["held"] is None
    for bad in (["chmod", 1], ["write", 0], ["write", True], "write@1"):
        with pytest.raises(PowerFSError, match="arm takes"):
            mnt.fs.trap(arm=bad, notify=str(tmp_path / "x"))
    with pytest.raises(PowerFSError, match="absolute path"):
        mnt.fs.trap(arm=["write", 1], notify="relative")
    with pytest.raises(PowerFSError, match="release go or fail"):
        mnt.fs.trap(release="maybe")
