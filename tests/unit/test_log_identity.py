"""A log's identity (``Storage.identity``): made at its creation, durable before its
first commit, kept whatever later commits a power cut takes, and never shared by two
logs, not even by a new log at the path of a deleted one. The adapter names Spaces, exec
keys and owner records by it (``adapter/log_witness.py``), so a log that lost its tail
must keep it and a new log must never inherit it."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from durable_spaces.errors import CorruptLogError
from durable_spaces.harness.log import JsonlStorage, MemoryStorage, SqliteStorage
from durable_spaces.harness.log_core import IDENTITY


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)  # as a log's file is


def _sqlite(path: Path, commits: int = 0) -> str:
    with SqliteStorage(path) as s:
        for n in range(commits):
            s.append([{"n": n}])
        return s.identity


def test_a_sqlite_log_keeps_its_identity_and_a_new_log_at_its_path_has_another(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.sqlite"
    first = _sqlite(path, commits=2)
    assert IDENTITY.fullmatch(first)
    assert _sqlite(path) == first  # reopened: the same log
    assert _sqlite(tmp_path / "other.sqlite") != first  # a second log file
    for f in tmp_path.glob("log.sqlite*"):
        f.unlink()  # the user deletes the log
    assert _sqlite(path) != first  # a new log, not the old one that lost everything


def test_a_sqlite_log_that_lost_every_commit_keeps_its_identity(tmp_path: Path) -> None:
    """At ``NORMAL`` a WAL that was never checkpointed is all a power cut may take: the
    main file as it was created holds the identity."""
    path = tmp_path / "log.sqlite"
    s = SqliteStorage(path)  # stays open: nothing is checkpointed into the main file
    for n in range(5):
        s.append([{"n": n}])
    kept = tmp_path / "kept"
    kept.mkdir()
    shutil.copy(path, kept / "log.sqlite")  # the main file alone: every commit lost
    s.close()
    with SqliteStorage(kept / "log.sqlite") as lost:
        assert lost.load() == []
        assert lost.identity == s.identity


def test_a_sqlite_log_of_schema_1_gets_an_identity_once(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    _sqlite(path, commits=2)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TABLE cua_log")
    conn.execute("PRAGMA user_version=1")  # a log written before identities
    conn.close()
    with SqliteStorage(path) as s:
        given = s.identity
        assert len(s.load()) == 2
    assert IDENTITY.fullmatch(given)
    assert _sqlite(path) == given
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    conn.close()


@pytest.mark.parametrize("bad", ["", "x; rm -rf /", "A" * 32, "0" * 31, "../" * 11])
def test_a_sqlite_identity_that_is_not_one_is_a_damaged_log(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "log.sqlite"
    _sqlite(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE cua_log SET log_id = ?", (bad,))
    conn.close()
    with pytest.raises(CorruptLogError, match="identity"):
        SqliteStorage(path)


def test_a_jsonl_log_holds_its_identity_on_its_first_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    with JsonlStorage(path, fsync=False) as s:
        s.append([{"n": 1}])
        s.append([{"n": 2}])
        ident = s.identity
    lines = path.read_bytes().splitlines(keepends=True)
    assert json.loads(lines[0]) == {"log": ident}
    path.write_bytes(lines[0])  # a cut took every unsynced commit
    with JsonlStorage(path) as s:
        assert s.identity == ident and s.load() == []
        assert s.append([{"n": 3}]) == 1
    path.unlink()  # the user deletes the log
    with JsonlStorage(path) as s:
        assert s.identity != ident


def test_a_jsonl_log_whose_identity_line_was_torn_gets_a_whole_one(tmp_path: Path) -> None:
    """Nothing whole was ever written (a creator killed mid-write): a new log."""
    path = tmp_path / "log.jsonl"
    _write(path, b'{"log": "0123')
    with JsonlStorage(path) as s:
        assert IDENTITY.fullmatch(s.identity) and s.load() == []
    assert json.loads(path.read_bytes().splitlines()[0]) == {"log": s.identity}


def test_a_jsonl_log_written_before_identities_takes_a_stable_one(tmp_path: Path) -> None:
    line = b'{"seq":1,"epoch":null,"ops":[{"n":1}]}\n'
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(a, line)
    _write(b, line)  # the same first commit, another log
    with JsonlStorage(a) as s:
        first = s.identity
        assert [c.ops for c in s.load()] == [[{"n": 1}]]
        assert s.append([{"n": 2}]) == 2
    with JsonlStorage(a) as s:
        assert s.identity == first
    with JsonlStorage(b) as s:
        assert s.identity != first
    assert a.read_bytes().startswith(line)  # nothing was written before its commits


@pytest.mark.parametrize("bad", ['"x; rm -rf /"', '"ABCDEF0123456789ABCDEF0123456789"', "1"])
def test_a_jsonl_identity_that_is_not_one_is_a_damaged_log(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "log.jsonl"
    _write(path, b'{"log": ' + bad.encode() + b"}\n")
    with pytest.raises(CorruptLogError, match="identity"):
        JsonlStorage(path)


def test_memory_logs_are_each_their_own() -> None:
    assert MemoryStorage().identity != MemoryStorage().identity
