"""The durable log's storages: atomic, ordered commits that replay after a reopen, private
files, one owner at a time (checked from a real second process), torn JSONL tails."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_spaces.errors import (
    ConfigError,
    CorruptLogError,
    LogError,
    StorageLockedError,
    TornTailWarning,
)
from durable_spaces.harness.log import (
    Commit,
    JsonlStorage,
    MemoryStorage,
    SqliteStorage,
    Storage,
    open_storage,
)

Opener = Callable[[Path], Storage]

FILE_KINDS: dict[str, Opener] = {
    "sqlite-normal": lambda p: SqliteStorage(p / "log.db"),
    "sqlite-full": lambda p: SqliteStorage(p / "log.db", synchronous="FULL"),
    "jsonl": lambda p: JsonlStorage(p / "log.jsonl"),
}


@pytest.fixture(params=sorted(FILE_KINDS))
def opener(request: pytest.FixtureRequest) -> Opener:
    return FILE_KINDS[request.param]


@pytest.fixture
def umask022() -> Iterator[None]:
    old = os.umask(0o022)  # a permissive umask: 0600 must come from the code, not the umask
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- atomicity, order, replay --------------------------------------------------------------


def test_appends_are_ordered_and_replay_after_reopen(opener: Opener, tmp_path: Path) -> None:
    s = opener(tmp_path)
    assert s.load() == []
    batches: list[list[dict[str, Any]]] = [
        [{"kind": "entry", "text": "hi ☃\n"}, {"kind": "doc", "v": 1}],
        [],
        [{"n": 3}],
    ]
    assert [s.append(b) for b in batches] == [1, 2, 3]
    assert s.load() == [Commit(i + 1, b) for i, b in enumerate(batches)]
    s.close()

    s = opener(tmp_path)
    assert s.load() == [Commit(i + 1, b) for i, b in enumerate(batches)]
    assert s.append([{"n": 4}]) == 4
    s.close()
    s = opener(tmp_path)
    assert [c.seq for c in s.load()] == [1, 2, 3, 4]
    s.close()


def test_memory_storage_orders_commits() -> None:
    s = MemoryStorage()
    assert [s.append([{"n": i}]) for i in range(3)] == [1, 2, 3]
    assert [c.ops for c in s.load()] == [[{"n": 0}], [{"n": 1}], [{"n": 2}]]


def test_an_unserializable_commit_stores_nothing(opener: Opener, tmp_path: Path) -> None:
    s = opener(tmp_path)
    s.append([{"n": 1}])
    with pytest.raises(TypeError):
        s.append([{"n": 2}, {"bad": object()}])
    assert s.append([{"n": 3}]) == 2
    s.close()
    s = opener(tmp_path)
    assert [c.ops for c in s.load()] == [[{"n": 1}], [{"n": 3}]]
    s.close()


def test_stored_ops_are_copies(opener: Opener, tmp_path: Path) -> None:
    s = opener(tmp_path)
    op = {"n": 1}
    s.append([op])
    op["n"] = 99
    assert s.load()[0].ops == [{"n": 1}]
    s.close()


def test_closed_storage_refuses(opener: Opener, tmp_path: Path) -> None:
    s = opener(tmp_path)
    s.close()
    s.close()  # idempotent
    with pytest.raises(LogError):
        s.append([])


# --- files: modes and ownership ------------------------------------------------------------


def test_sqlite_files_are_private(tmp_path: Path, umask022: None) -> None:
    s = SqliteStorage(tmp_path / "log.db")
    s.append([{"secret": "x"}])
    for name in ("log.db", "log.db-wal", "log.db-shm", "log.db.lock"):
        assert _mode(tmp_path / name) == 0o600, name
    s.close()


def test_jsonl_files_are_private(tmp_path: Path, umask022: None) -> None:
    s = JsonlStorage(tmp_path / "log.jsonl")
    s.append([{"secret": "x"}])
    for name in ("log.jsonl", "log.jsonl.lock"):
        assert _mode(tmp_path / name) == 0o600, name
    s.close()


OPEN_IN_CHILD = textwrap.dedent(
    """
    import sys
    from durable_spaces.harness.log import JsonlStorage, SqliteStorage
    from durable_spaces.errors import StorageLockedError
    cls = {"sqlite": SqliteStorage, "jsonl": JsonlStorage}[sys.argv[1]]
    try:
        s = cls(sys.argv[2])
    except StorageLockedError as e:
        print("locked:", e)
        sys.exit(3)
    print("opened", len(s.load()))
    """
)


def _open_in_child(kind: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", OPEN_IN_CHILD, kind, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_second_process_gets_storage_locked_error(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"log.{kind}"
    s = SqliteStorage(path) if kind == "sqlite" else JsonlStorage(path)
    s.append([{"n": 1}])

    child = _open_in_child(kind, path)
    assert child.returncode == 3, child.stderr
    assert str(path) in child.stdout
    assert f"process {os.getpid()}" in child.stdout

    s.close()
    child = _open_in_child(kind, path)
    assert child.returncode == 0, child.stdout + child.stderr
    assert child.stdout.strip() == "opened 1"


def test_second_opener_in_same_process_is_refused(tmp_path: Path) -> None:
    s = SqliteStorage(tmp_path / "log.db")
    with pytest.raises(StorageLockedError, match="in this process"):
        SqliteStorage(tmp_path / "log.db")
    s.close()
    SqliteStorage(tmp_path / "log.db").close()


def test_lock_dies_with_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    code = (
        "import sys; from durable_spaces.harness.log import SqliteStorage\n"
        "s = SqliteStorage(sys.argv[1]); s.append([{'n': 1}]); print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(StorageLockedError, match=f"process {child.pid}"):
            SqliteStorage(path)
    finally:
        child.kill()
        child.wait()
    with SqliteStorage(path) as s:  # a SIGKILLed owner leaves no stale lock
        assert [c.ops for c in s.load()] == [[{"n": 1}]]


# --- JSONL: torn tails and damage ----------------------------------------------------------


def _two_commits(path: Path) -> None:
    with JsonlStorage(path) as s:
        s.append([{"n": 1}])
        s.append([{"n": 2}])


@pytest.mark.parametrize(
    "tail",
    [b'{"seq":3,"epoch":null,"op', b'{"seq":3,"epoch":null,"ops":[]}', b"\x00\x00\x00", b"{]\n"],
    ids=["partial", "no-newline", "zeros", "garbage-line"],
)
def test_torn_tail_is_reported_ignored_then_truncated(tail: bytes, tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    _two_commits(path)
    good = path.read_bytes()
    with path.open("ab") as f:
        f.write(tail)

    with pytest.warns(TornTailWarning, match="torn last line"):
        s = JsonlStorage(path)
    assert s.torn_tail is not None and "line 4" in s.torn_tail  # after the identity's line
    assert [c.ops for c in s.load()] == [[{"n": 1}], [{"n": 2}]]
    assert path.read_bytes() == good + tail  # reading alone changes nothing
    assert s.append([{"n": 3}]) == 3
    assert s.torn_tail is None
    s.close()

    lines = path.read_bytes().splitlines()
    assert json.loads(lines[0]) == {"log": s.identity}
    assert [json.loads(x)["seq"] for x in lines[1:]] == [1, 2, 3]
    with JsonlStorage(path) as s:
        assert s.torn_tail is None
        assert [c.ops for c in s.load()] == [[{"n": 1}], [{"n": 2}], [{"n": 3}]]


def test_corrupt_middle_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    _two_commits(path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b'{"seq":2,"ep\n' + lines[1].replace(b'"seq":2', b'"seq":3'))
    with pytest.raises(CorruptLogError, match=r"log\.jsonl: line 2 is not valid JSON"):
        JsonlStorage(path)
    # a failed open leaves no lock behind
    path.write_bytes(b"".join(lines))
    JsonlStorage(path).close()


@pytest.mark.parametrize(
    ("line", "why"),
    [(b'{"seq":5,"epoch":null,"ops":[]}\n', "holds seq 5"), (b"[1,2]\n", "is not a commit record")],
)
def test_wrong_record_is_corruption_even_last(line: bytes, why: str, tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    _two_commits(path)
    with path.open("ab") as f:
        f.write(line)
    with pytest.raises(CorruptLogError, match=f"line 4 {why}"):  # after the identity's line
        JsonlStorage(path)


def test_sqlite_garbage_file_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    path.write_bytes(b"this is not a database, it is a text file\n" * 200)
    with pytest.raises(CorruptLogError, match=str(path)):
        SqliteStorage(path)
    path.unlink()
    SqliteStorage(path).close()  # the failed open released its lock


# --- open_storage --------------------------------------------------------------------------


def test_open_storage_urls(tmp_path: Path) -> None:
    assert isinstance(open_storage("memory:"), MemoryStorage)
    cases = {
        f"sqlite:{tmp_path}/a.db": (SqliteStorage, "a.db"),
        f"sqlite://{tmp_path}/b.db": (SqliteStorage, "b.db"),
        f"jsonl:{tmp_path}/c.log": (JsonlStorage, "c.log"),
        f"{tmp_path}/d.jsonl": (JsonlStorage, "d.jsonl"),
        f"{tmp_path}/e.sqlite": (SqliteStorage, "e.sqlite"),
    }
    for url, (cls, name) in cases.items():
        s = open_storage(url)
        assert isinstance(s, cls), url
        s.append([{"url": url}])
        s.close()
        assert (tmp_path / name).exists()
    full = open_storage(f"sqlite:{tmp_path}/f.db", synchronous="FULL")
    assert isinstance(full, SqliteStorage) and full.synchronous == "FULL"
    full.close()
    for bad in ("sqlite:", "memory:x"):
        with pytest.raises(ConfigError):
            open_storage(bad)
    with pytest.raises(ConfigError):
        SqliteStorage(tmp_path / "g.db", synchronous="OFF")


def test_load_after_append_equals_load_after_reopen(opener: Opener, tmp_path: Path) -> None:
    s = opener(tmp_path)
    nested: dict[str, Any] = {"doc": {"items": [1, 2]}, "pair": (1, 2)}
    s.append([nested])
    nested["doc"]["items"].append(3)
    before = s.load()
    s.close()
    s = opener(tmp_path)
    assert before == s.load() == [Commit(1, [{"doc": {"items": [1, 2]}, "pair": [1, 2]}])]
    s.close()


def test_encoded_ops_store_the_text_their_encoding_gives() -> None:
    """The harness's commit encodes its ops once (``encoded``) and a file storage stores
    that text: it must be what encoding the plain ops gives, for awkward values too."""
    from durable_spaces.harness.log_core import dumps_ops, encoded

    ops = [
        {"op": "doc", "t": (1, 2), "u": "é\u2028\x00", "f": 0.1, "n": float("nan"), 3: None},
        {"op": "entry", "big": 2**70, "nested": {"a": [True, {"b": -0.0}]}},
    ]
    enc = encoded(ops)
    plain = json.loads(json.dumps(ops))  # what the harness stored before: plain JSON
    assert dumps_ops(enc) == dumps_ops(plain)  # the text as if encoded again
    assert enc[1] == plain[1] and type(enc[0]["t"]) is list  # tuples became lists


def test_a_sqlite_log_reads_back_what_an_encoded_commit_stored(tmp_path: Path) -> None:
    from durable_spaces.harness.log_core import encoded

    storage = SqliteStorage(tmp_path / "log.sqlite")
    ops = [{"op": "doc", "value": {"k": (1, "x"), "s": "ü"}}]
    storage.append(encoded(ops))
    storage.close()
    again = SqliteStorage(tmp_path / "log.sqlite")
    try:
        assert again.load()[0].ops == [{"op": "doc", "value": {"k": [1, "x"], "s": "ü"}}]
    finally:
        again.close()
