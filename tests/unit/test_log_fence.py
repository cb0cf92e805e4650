"""The log's epoch fence: real processes of two epochs writing one log, the exact SQLite
fence (refused atomically), the best-effort marker-file fence for JSONL, and halt."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_spaces.errors import (
    FenceHaltedError,
    StaleEpochError,
    StorageLockedError,
    TornTailWarning,
)
from durable_spaces.harness.log import (
    FencedFileSystem,
    JsonlStorage,
    MemoryFence,
    SqliteStorage,
    open_fenced_jsonl,
    open_fenced_sqlite,
)

CHILD = Path(__file__).resolve().parent.parent / "crash" / "log_child.py"
TIMEOUT = 60.0


class Writer:
    """A child process writing the log at one epoch, driven one command at a time."""

    def __init__(self, kind: str, path: Path, epoch: int, *mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), kind, str(path), str(epoch), *mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert self.line() == "ready"

    def line(self) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        assert ready, "child writer did not answer"
        return self.proc.stdout.readline().strip()

    def ask(self, cmd: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.line()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def writers() -> Iterator[list[Writer]]:
    started: list[Writer] = []
    yield started
    for w in started:
        w.stop()


def _open_reader(kind: str, path: Path) -> SqliteStorage | JsonlStorage:
    return (open_fenced_sqlite if kind == "fenced-sqlite" else open_fenced_jsonl)(path, 0)[0]


@pytest.mark.parametrize("kind", ["fenced-sqlite", "fenced-jsonl"])
def test_older_epoch_is_refused_after_newer_commits(
    kind: str, tmp_path: Path, writers: list[Writer]
) -> None:
    path = tmp_path / ("log.db" if kind == "fenced-sqlite" else "log.jsonl")
    old = Writer(kind, path, 1, "serve")
    writers.append(old)
    assert old.ask("append") == "ok 1"
    assert old.ask("append") == "ok 2"
    new = Writer(kind, path, 2, "serve")
    writers.append(new)
    assert old.ask("append") == "ok 3"  # the floor rises on the new epoch's first commit
    assert new.ask("append") == "ok 4"

    assert old.ask("append") == "stale StaleEpochError 1 2"
    assert old.ask("check") == "stale StaleEpochError 1 2"
    assert old.ask("append") == "stale StaleEpochError 1 2"
    assert new.ask("append") == "ok 5"
    assert new.ask("check") == "ok"

    reader = _open_reader(kind, path)
    got = [(c.seq, c.epoch, c.ops) for c in reader.load()]
    reader.close()
    assert got == [
        (1, 1, [{"writer": 1, "n": 1}]),
        (2, 1, [{"writer": 1, "n": 2}]),
        (3, 1, [{"writer": 1, "n": 3}]),
        (4, 2, [{"writer": 2, "n": 1}]),
        (5, 2, [{"writer": 2, "n": 2}]),
    ]
    assert old.ask("quit") == "bye"
    assert new.ask("quit") == "bye"


def test_sqlite_fence_under_a_race(tmp_path: Path, writers: list[Writer]) -> None:
    """Epoch 1 appends in a tight loop while epoch 2 takes over: no epoch-1 commit ever
    lands after an epoch-2 one, and every commit epoch 1 was told about is there."""
    path = tmp_path / "log.db"
    old = Writer("fenced-sqlite", path, 1, "loop", "100000", "200")
    writers.append(old)
    old_done = [int(old.line().split()[1]) for _ in range(20)]
    new = Writer("fenced-sqlite", path, 2, "loop", "30", "200")
    writers.append(new)
    assert new.proc.wait(TIMEOUT) == 0
    assert old.proc.wait(TIMEOUT) == 75
    assert old.proc.stdout is not None
    rest = old.proc.stdout.read().split("\n")
    old_done += [int(x.split()[1]) for x in rest if x.startswith("done ")]
    assert any(x.startswith("stale 1 2") for x in rest)

    reader = _open_reader("fenced-sqlite", path)
    commits = reader.load()
    reader.close()
    epochs = [c.epoch or 0 for c in commits]
    assert [c.seq for c in commits] == list(range(1, len(commits) + 1))
    assert epochs == sorted(epochs)  # once epoch 2 wrote, epoch 1 never did
    assert epochs.count(2) == 30
    assert {c.seq for c in commits if c.epoch == 1} == set(old_done)


@pytest.mark.parametrize("kind", ["fenced-sqlite", "fenced-jsonl"])
def test_halt_refuses_every_later_commit(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "log"
    opener = open_fenced_sqlite if kind == "fenced-sqlite" else open_fenced_jsonl
    storage, fence = opener(path, 3)
    assert storage.append([{"n": 1}]) == 1
    assert not fence.halted
    fence.halt("the Space cannot be fenced")
    assert fence.halted
    for _ in range(2):
        with pytest.raises(FenceHaltedError):
            storage.append([{"n": 2}])
    with pytest.raises(FenceHaltedError):
        fence.check()
    assert [c.ops for c in storage.load()] == [[{"n": 1}]]
    other, _ = opener(path, 3)  # halt is per writer: another writer at the epoch goes on
    assert other.append([{"n": 3}]) == 2
    other.close()
    storage.close()


def test_open_below_the_floor_fails_on_check_and_append(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    new, _ = open_fenced_sqlite(path, 5)
    new.append([{"n": 1}])
    old, old_fence = open_fenced_sqlite(path, 4)  # allowed, so it can learn it is stale
    assert old_fence.floor() == 5
    with pytest.raises(StaleEpochError) as e:
        old_fence.check()
    assert (e.value.epoch, e.value.floor, e.value.where) == (4, 5, "log")
    with pytest.raises(StaleEpochError):
        old.append([{"n": 2}])
    with pytest.raises(StaleEpochError):
        old_fence.advance()
    assert [c.epoch for c in new.load()] == [5]
    old.close()
    new.close()


def test_advance_raises_the_floor_before_any_commit(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    old, old_fence = open_fenced_sqlite(path, 1)
    old.append([{"n": 1}])
    new, new_fence = open_fenced_sqlite(path, 2, synchronous="FULL")
    old.append([{"n": 2}])  # epoch 2 has not claimed the floor yet
    new_fence.advance()
    assert old_fence.floor() == 2
    with pytest.raises(StaleEpochError):
        old.append([{"n": 3}])
    assert [c.ops for c in new.load()] == [[{"n": 1}], [{"n": 2}]]
    old.close()
    new.close()


def test_fenced_and_exclusive_openers_exclude_each_other(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    a, _ = open_fenced_sqlite(path, 1)
    b, _ = open_fenced_sqlite(path, 2)  # fenced writers share the file
    with pytest.raises(StorageLockedError, match="already open"):
        SqliteStorage(path)
    a.close()
    b.close()
    owner = SqliteStorage(path)
    with pytest.raises(StorageLockedError, match="owned exclusively"):
        open_fenced_sqlite(path, 3)
    owner.close()


def test_fenced_file_system_markers(tmp_path: Path) -> None:
    d = tmp_path / "fence"
    one, two = FencedFileSystem(d, 1), FencedFileSystem(d, 2)
    assert one.floor() == 0
    one.check()
    assert sorted(os.listdir(d)) == ["epoch-1"] and one.floor() == 1
    one.check()  # idempotent
    two.advance()
    assert sorted(os.listdir(d)) == ["epoch-1", "epoch-2"] and one.floor() == 2
    with pytest.raises(StaleEpochError) as e:
        one.check()
    assert (e.value.epoch, e.value.floor) == (1, 2)
    (d / "not-a-marker").write_text("")
    (d / "epoch-x").write_text("")
    assert two.floor() == 2


def test_jsonl_fence_refuses_stale_append_and_stores_nothing(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    old, _ = open_fenced_jsonl(path, 1)
    new, new_fence = open_fenced_jsonl(path, 2)
    old.append([{"n": 1}])
    new_fence.advance()
    size = path.stat().st_size
    with pytest.raises(StaleEpochError):
        old.append([{"n": 2}])
    assert path.stat().st_size == size
    assert new.append([{"n": 3}]) == 2  # seqs stay contiguous across writers
    assert old.load() == new.load()
    assert [(c.seq, c.epoch) for c in new.load()] == [(1, 1), (2, 2)]
    old.close()
    new.close()


@pytest.mark.parametrize("cls", [SqliteStorage, JsonlStorage])
def test_any_fence_guards_a_storage(cls: type, tmp_path: Path) -> None:
    shared = MemoryFence(1)
    old = cls(tmp_path / "a", fence=shared)
    old.append([{"n": 1}])
    shared.writer(2).check()
    with pytest.raises(StaleEpochError):
        old.append([{"n": 2}])
    assert [(c.seq, c.epoch) for c in old.load()] == [(1, 1)]
    old.close()


def test_uncommitted_floor_and_commit_are_invisible(tmp_path: Path) -> None:
    """Nothing is visible before its commit: while another writer is inside its
    transaction (floor raised, commit inserted, not committed), readers and ``check()``
    see the old state and do not block on its write lock."""
    storage, fence = open_fenced_sqlite(tmp_path / "log.db", 1)
    storage.append([{"n": 1}])
    other, _ = open_fenced_sqlite(tmp_path / "log.db", 2)
    db = other._db
    db.execute("BEGIN IMMEDIATE")
    db.execute("UPDATE cua_fence SET floor = 2 WHERE id = 1")
    db.execute("INSERT INTO cua_commits (seq, epoch, ops) VALUES (2, 2, '[]')")
    fence.check()
    assert fence.floor() == 1
    assert [c.seq for c in storage.load()] == [1]
    db.execute("ROLLBACK")
    assert storage.append([{"n": 2}]) == 2
    other.close()
    storage.close()


def test_fenced_jsonl_writers_share_a_repaired_tail(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    first, _ = open_fenced_jsonl(path, 1)
    first.append([{"n": 1}])
    first.close()
    with path.open("ab") as f:
        f.write(b'{"seq":2,"ep')
    with pytest.warns(TornTailWarning):
        a, _ = open_fenced_jsonl(path, 1)
    with pytest.warns(TornTailWarning):
        b, _ = open_fenced_jsonl(path, 1)
    assert b.append([{"n": 2}]) == 2  # b truncates the tail a saw, then appends
    assert [c.ops for c in a.load()] == [[{"n": 1}], [{"n": 2}]]
    assert a.torn_tail is None
    assert a.append([{"n": 3}]) == 3
    assert [c.seq for c in b.load()] == [1, 2, 3]
    a.close()
    b.close()
