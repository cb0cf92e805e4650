"""Crash tests of the durable log with real processes: a child appends commits in a loop
and is SIGKILLed at a random moment (hypothesis picks the moment, the storage and the
commit size) or at a failpoint inside a commit. The reopened storage is never corrupt,
its seqs are contiguous, every commit is whole, and every commit the child was told was
stored is there."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from durable_spaces.errors import TornTailWarning
from durable_spaces.harness.log import JsonlStorage, SqliteStorage, Storage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from log_child import ops_for

CHILD = Path(__file__).resolve().parent / "log_child.py"
KINDS = ["sqlite", "sqlite-full", "jsonl"]


def _path(directory: Path, kind: str) -> Path:
    return directory / ("log.jsonl" if kind == "jsonl" else "log.db")


def _reopen(directory: Path, kind: str) -> Storage:
    path = _path(directory, kind)
    if kind == "jsonl":
        return JsonlStorage(path)
    return SqliteStorage(path, synchronous="FULL" if kind == "sqlite-full" else "NORMAL")


def _start(
    directory: Path, kind: str, count: int, pad: int, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [
            sys.executable,
            str(CHILD),
            kind,
            str(_path(directory, kind)),
            "0",
            "loop",
            str(count),
            str(pad),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], 60)
    assert ready and child.stdout.readline().strip() == "ready"
    return child


def _finish(child: subprocess.Popen[str]) -> str:
    """Wait for the child and read all it printed (not ``communicate(timeout=...)``: that
    reads the raw pipe and would lose what ``readline`` already buffered)."""
    child.wait(60)
    assert child.stdout is not None
    out = child.stdout.read()
    child.stdout.close()
    return out


def _done(stdout: str) -> list[int]:
    # the last line may itself be cut off by the kill: only whole lines count
    return [int(x.split()[1]) for x in stdout.split("\n")[:-1] if x.startswith("done ")]


def _check(directory: Path, kind: str, pad: int, done: list[int]) -> tuple[int, str | None]:
    """The crash invariants; returns how many commits survived, and any torn tail."""
    torn = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        storage = _reopen(directory, kind)  # never CorruptLogError
    commits = storage.load()
    n = len(commits)
    assert [c.seq for c in commits] == list(range(1, n + 1))
    for c in commits:
        assert c.ops == ops_for(c.seq, pad), f"commit {c.seq} is not whole"
    assert done == list(range(1, len(done) + 1))
    assert len(done) <= n <= len(done) + 1  # at most the one commit it was not told about
    if kind == "jsonl":
        assert isinstance(storage, JsonlStorage)
        warned = [w for w in caught if issubclass(w.category, TornTailWarning)]
        assert bool(warned) == (storage.torn_tail is not None)
        torn = storage.torn_tail
    assert storage.append(ops_for(n + 1, pad)) == n + 1  # and it goes on
    storage.close()
    again = _reopen(directory, kind)
    assert [c.seq for c in again.load()] == list(range(1, n + 2))
    again.close()
    return n, torn


@settings(max_examples=15, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    after=st.integers(min_value=0, max_value=12),
    delay=st.floats(min_value=0.0, max_value=0.03),
    pad=st.sampled_from([16, 1024, 2_000_000]),  # 6 MB lines can tear under SIGKILL
)
def test_sigkill_at_a_random_moment(kind: str, after: int, delay: float, pad: int) -> None:
    """Kill ``delay`` seconds after the child reported ``after`` commits."""
    with tempfile.TemporaryDirectory(prefix="log-crash-") as d:
        directory = Path(d)
        child = _start(directory, kind, 1_000_000, pad)
        assert child.stdout is not None
        seen = [child.stdout.readline() for _ in range(after)]
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        out = "".join(seen) + _finish(child)
        assert child.returncode == -signal.SIGKILL
        done = _done(out)
        n, torn = _check(directory, kind, pad, done)
        event(f"torn tail: {torn is not None}")
        event(f"stored but unreported commit: {n == len(done) + 1}")
        event(f"{kind}, pad {pad}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("point", "kept"), [("log.before_commit", 2), ("log.after_commit", 3)])
def test_kill_inside_a_commit(kind: str, point: str, kept: int, tmp_path: Path) -> None:
    """A kill while the third commit is built loses it whole; right after it is stored,
    it is there although the child never heard back."""
    child = _start(tmp_path, kind, 10, 64, env={"DS_FAILPOINTS": f"{point}:3"})
    out = _finish(child)
    assert child.returncode == -signal.SIGKILL
    assert _done(out) == [1, 2]
    assert _check(tmp_path, kind, 64, _done(out)) == (kept, None)


def test_resumed_writer_continues_the_line(tmp_path: Path) -> None:
    """Kill, reopen in a new process, kill again: the line stays contiguous across lives."""
    total: list[int] = []
    for life in range(3):
        child = _start(tmp_path, "jsonl", 5 + life, 512, env={"DS_FAILPOINTS": ""})
        out = _finish(child)
        assert child.returncode == 0
        total += _done(out)
    assert total == list(range(1, 5 + 6 + 7 + 1))
    with JsonlStorage(_path(tmp_path, "jsonl")) as s:
        assert [c.ops for c in s.load()] == [ops_for(i, 512) for i in total]


def _jsonl_with_two_commits(directory: Path, pad: int) -> int:
    child = _start(directory, "jsonl", 2, pad)
    assert _done(_finish(child)) == [1, 2]
    return _path(directory, "jsonl").stat().st_size


def test_sigkill_after_a_short_write_leaves_a_torn_tail(tmp_path: Path) -> None:
    """A real torn line: a file size limit makes the third write short and the failpoint
    kills the child right there. Reopen reports the tail, ignores it, then repairs it."""
    size = _jsonl_with_two_commits(tmp_path, 4096)
    env = {"LOG_CHILD_FSIZE": str(size + 100), "DS_FAILPOINTS": "log.short_write:1"}
    child = _start(tmp_path, "jsonl", 5, 4096, env=env)
    assert _done(_finish(child)) == []
    assert child.returncode == -signal.SIGKILL
    assert _path(tmp_path, "jsonl").stat().st_size == size + 100
    with pytest.warns(TornTailWarning):
        s = JsonlStorage(_path(tmp_path, "jsonl"))
    assert s.torn_tail == "line 4: 100 bytes without a newline"  # after the identity's line
    s.close()
    assert _check(tmp_path, "jsonl", 4096, [1, 2]) == (2, "line 4: 100 bytes without a newline")


def test_failed_write_is_rolled_back(tmp_path: Path) -> None:
    """Without the failpoint the short write is followed by EFBIG (Python ignores
    SIGXFSZ): append raises and truncates its half line away, so nothing is torn."""
    size = _jsonl_with_two_commits(tmp_path, 4096)
    child = _start(tmp_path, "jsonl", 5, 4096, env={"LOG_CHILD_FSIZE": str(size + 100)})
    assert _done(_finish(child)) == []
    assert child.returncode == 1
    assert _path(tmp_path, "jsonl").stat().st_size == size
    with warnings.catch_warnings():
        warnings.simplefilter("error", TornTailWarning)
        s = JsonlStorage(_path(tmp_path, "jsonl"))
    assert s.torn_tail is None
    assert [c.ops for c in s.load()] == [ops_for(1, 4096), ops_for(2, 4096)]
    s.close()
