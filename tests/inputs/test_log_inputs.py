"""Bad things at a log's paths: symlinks (the log and every sidecar), loose modes, another
program's SQLite database, damaged and empty files, directories, FIFOs, JSONL lines of
the wrong shape or size, epochs SQLite cannot store. Each is a typed error naming the
file; the file, whatever a symlink points at, and the directory around are unchanged;
a log of ours beside it still reads."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from tree_snapshot import sha, tree

from durable_spaces.errors import (
    ConfigError,
    CorruptLogError,
    ForeignDatabaseError,
    LogError,
    LooseModeWarning,
)
from durable_spaces.harness.log import (
    APPLICATION_ID,
    MAX_LINE_BYTES,
    FencedFileSystem,
    JsonlStorage,
    SqliteStorage,
    open_fenced_jsonl,
    open_fenced_sqlite,
)

KINDS: dict[str, tuple[str, Callable[[Path], SqliteStorage | JsonlStorage]]] = {
    "sqlite": ("log.sqlite", lambda p: SqliteStorage(p)),
    "sqlite-fenced": ("log.sqlite", lambda p: open_fenced_sqlite(p, 3)[0]),
    "jsonl": ("log.jsonl", lambda p: JsonlStorage(p)),
    "jsonl-fenced": ("log.jsonl", lambda p: open_fenced_jsonl(p, 3)[0]),
}


def _log(tmp_path: Path, kind: str, commits: int = 2) -> Path:
    """A log of ours with ``commits`` commits, closed (no -wal/-shm left)."""
    name, opener = KINDS[kind]
    path = tmp_path / "state" / name
    path.parent.mkdir(exist_ok=True)
    s = opener(path)
    for i in range(commits):
        s.append([{"n": i}])
    s.close()
    return path


def _reads(path: Path, kind: str, commits: int = 2) -> None:
    s = KINDS[kind][1](path)
    try:
        assert [c.ops for c in s.load()] == [[{"n": i}] for i in range(commits)]
    finally:
        s.close()


def _quiet() -> warnings.catch_warnings[list[warnings.WarningMessage]]:
    """Record (and so silence) warnings: an old log's loose modes are tightened noisily."""
    return warnings.catch_warnings(record=True)


# --- symlinks: the log and every sidecar -----------------------------------------------

SIDECARS = {
    "sqlite": ["", "-wal", "-shm", ".lock"],
    "sqlite-fenced": ["", "-wal", "-shm", ".lock"],
    "jsonl": ["", ".lock"],
    "jsonl-fenced": ["", ".lock", ".fence"],
}
SYMLINK_CASES = [(k, s) for k, sides in SIDECARS.items() for s in sides]
SYMLINK_IDS = [f"{k}{s or '-main'}" for k, s in SYMLINK_CASES]


@pytest.mark.parametrize(
    ("kind", "suffix"), SYMLINK_CASES, ids=[f"{k}{s or '-main'}" for k, s in SYMLINK_CASES]
)
def test_a_symlink_at_the_log_or_a_sidecar_is_refused_not_followed(
    kind: str, suffix: str, tmp_path: Path, outside: Path
) -> None:
    path = _log(tmp_path, kind)
    target = outside / "target"
    if suffix == ".fence":
        target.mkdir()
    else:
        target.write_bytes(b"SQLite format 3\x00 not really\n")
    link = Path(f"{path}{suffix}")
    moved = None
    if suffix == "":  # the log itself: keep our log aside, plant the link in its place
        moved = path.with_name("kept")
        path.rename(moved)
    elif link.exists() or link.is_dir():
        if link.is_dir():
            for p in link.iterdir():
                p.unlink()
            link.rmdir()
        else:
            link.unlink()
    link.symlink_to(target)
    before = tree(outside)
    with pytest.raises(LogError, match="symbolic link") as err:
        KINDS[kind][1](path)
    assert str(link) in str(err.value)
    assert tree(outside) == before  # nothing written through the link
    link.unlink()
    if moved is not None:
        moved.rename(path)
    _reads(path, kind)  # our log is still whole


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_a_dangling_symlink_at_a_new_log_creates_nothing(
    kind: str, tmp_path: Path, outside: Path
) -> None:
    path = tmp_path / KINDS[kind][0]
    path.symlink_to(outside / "not-yet")
    with pytest.raises(LogError, match="symbolic link"):
        KINDS[kind][1](path)
    assert not (outside / "not-yet").exists()
    assert sorted(os.listdir(tmp_path)) == sorted(["outside", path.name])


def test_a_symlink_at_the_creation_file_is_refused(tmp_path: Path, outside: Path) -> None:
    """A new SQLite log is built under .<name>.init: that name is not followed either."""
    (tmp_path / ".log.sqlite.init").symlink_to(outside / "precious")
    before = tree(outside)
    with pytest.raises(LogError, match="symbolic link"):
        SqliteStorage(tmp_path / "log.sqlite")
    assert tree(outside) == before and not (tmp_path / "log.sqlite").exists()


def test_a_symlinked_fence_marker_is_never_written_through(tmp_path: Path, outside: Path) -> None:
    path = _log(tmp_path, "jsonl-fenced")
    marker = Path(f"{path}.fence") / "epoch-4"
    marker.symlink_to(outside / "precious")
    before = tree(outside)
    storage, fence = open_fenced_jsonl(path, 4)
    storage.append([{"n": 2}])  # the marker "exists": the floor is 4, nothing is written
    storage.close()
    assert tree(outside) == before
    assert fence.floor() == 4


# --- modes: created private, tightened when found loose -----------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_new_log_files_are_0600_and_fence_dirs_0700(kind: str, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = _log(tmp_path, kind)
        s = KINDS[kind][1](path)  # open: the sidecars exist now
        s.append([{"n": 9}])
        for p in path.parent.iterdir():
            mode = stat.S_IMODE(os.lstat(p).st_mode)
            assert mode == (0o700 if p.is_dir() else 0o600), (p.name, oct(mode))
        s.close()
    finally:
        os.umask(old)


LEAVE_SIDECARS = """
import os, sys
from durable_spaces.harness.log import SqliteStorage
SqliteStorage(sys.argv[1]).append([{"n": 2}])
os._exit(0)  # killed: the -wal and -shm stay
"""


@pytest.mark.parametrize(
    ("kind", "suffix"),
    [
        ("sqlite", ""),
        ("sqlite", ".lock"),
        ("sqlite", "-wal"),
        ("sqlite", "-shm"),
        ("jsonl", ""),
        ("jsonl", ".lock"),
        ("jsonl-fenced", ".fence"),
    ],
)
def test_a_loose_log_file_is_tightened_with_a_warning(
    kind: str, suffix: str, tmp_path: Path
) -> None:
    """Decision: tighten (chmod through our O_NOFOLLOW / O_PATH descriptor), not refuse."""
    import subprocess
    import sys

    path = _log(tmp_path, kind)
    commits = 2
    target = Path(f"{path}{suffix}")
    if suffix in ("-wal", "-shm"):
        subprocess.run([sys.executable, "-c", LEAVE_SIDECARS, str(path)], check=True, timeout=60)
        commits = 3
    elif not target.exists():
        KINDS[kind][1](path).close()
    target.chmod(0o755 if target.is_dir() else 0o644)
    with pytest.warns(LooseModeWarning, match="tightened"):
        s = KINDS[kind][1](path)
    assert stat.S_IMODE(target.stat().st_mode) == (0o700 if target.is_dir() else 0o600)
    s.close()
    _reads(path, kind, commits)


def test_a_foreign_file_keeps_its_loose_mode(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    path.write_bytes(b"notes of another program\n")
    path.chmod(0o644)
    with pytest.raises(CorruptLogError):
        SqliteStorage(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


# --- another program's SQLite database ----------------------------------------------------


def _db(p: Path, *sql: str) -> None:
    """Another program's database: ``sql`` run in it, committed, closed."""
    c = sqlite3.connect(p)
    for stmt in sql:
        c.execute(stmt)
    c.commit()
    c.close()


USERS = ("CREATE TABLE users (name TEXT)", "INSERT INTO users VALUES ('ada')")
WAL = "PRAGMA journal_mode=WAL"
COMMITS = "CREATE TABLE cua_commits (seq INTEGER PRIMARY KEY, epoch INTEGER, ops TEXT NOT NULL)"


def _ours_plus_a_table(p: Path) -> None:
    _legacy(p)
    _db(p, "CREATE TABLE extra (x)")


FOREIGN: dict[str, Callable[[Path], None]] = {
    "rollback-journal": lambda p: _db(p, *USERS),
    "wal": lambda p: _db(p, WAL, *USERS),
    "other-application-id": lambda p: _db(p, WAL, "PRAGMA application_id=1234", COMMITS),
    "lookalike-columns": lambda p: _db(  # our two table names, other columns
        p,
        WAL,
        "CREATE TABLE cua_commits (seq INTEGER PRIMARY KEY, body BLOB)",
        "CREATE TABLE cua_fence (id INTEGER PRIMARY KEY, floor INTEGER NOT NULL)",
        "PRAGMA user_version=1",
    ),
    "our-tables-plus-one": _ours_plus_a_table,
    "no-tables": lambda p: _db(p, WAL),
}


@pytest.mark.parametrize("make", FOREIGN.values(), ids=FOREIGN.keys())
@pytest.mark.parametrize("fenced", [False, True], ids=["exclusive", "fenced"])
def test_another_programs_database_is_refused_and_not_modified(
    make: Callable[[Path], None], fenced: bool, tmp_path: Path
) -> None:
    path = tmp_path / "log.sqlite"
    make(path)
    digest, listing = sha(path), tree(tmp_path)
    with pytest.raises(ForeignDatabaseError, match="left untouched") as err:
        open_fenced_sqlite(path, 1) if fenced else SqliteStorage(path)
    assert str(path) in str(err.value)
    assert sha(path) == digest  # no table, no journal_mode, no user_version written
    assert tree(tmp_path) == listing  # no lock, -wal or -shm beside it
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert c.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID
    finally:
        c.close()


def _legacy(p: Path) -> None:
    """A log as the previous version made it: no application_id; killed before any
    checkpoint, so its schema and commits are only in the -wal."""
    c = sqlite3.connect(p, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("BEGIN IMMEDIATE")
    c.execute(
        "CREATE TABLE cua_commits ( seq INTEGER PRIMARY KEY, epoch INTEGER, ops TEXT NOT NULL)"
    )
    c.execute(
        "CREATE TABLE cua_fence ( id INTEGER PRIMARY KEY CHECK (id = 1), floor INTEGER NOT NULL)"
    )
    c.execute("INSERT INTO cua_fence (id, floor) VALUES (1, 0)")
    c.execute("PRAGMA user_version=1")
    c.execute("COMMIT")
    for i in range(2):
        c.execute("INSERT INTO cua_commits VALUES (?, NULL, ?)", (i + 1, json.dumps([{"n": i}])))
    c.close()


@pytest.mark.parametrize("checkpointed", [True, False], ids=["checkpointed", "wal-only"])
def test_a_log_of_the_previous_version_is_accepted_and_marked(
    checkpointed: bool, tmp_path: Path
) -> None:
    path = tmp_path / "log.sqlite"
    if checkpointed:
        _legacy(path)
    else:  # a killed old driver: the commits never left the WAL
        import subprocess
        import sys

        code = (
            "import sys, sqlite3, json, os\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('PRAGMA journal_mode=WAL'); c.execute('BEGIN IMMEDIATE')\n"
            "c.execute('CREATE TABLE cua_commits ( seq INTEGER PRIMARY KEY, epoch INTEGER, "
            "ops TEXT NOT NULL)')\n"
            "c.execute('CREATE TABLE cua_fence ( id INTEGER PRIMARY KEY CHECK (id = 1), "
            "floor INTEGER NOT NULL)')\n"
            "c.execute('INSERT INTO cua_fence VALUES (1, 0)'); c.execute('PRAGMA user_version=1')\n"
            "c.execute('COMMIT')\n"
            "for i in range(2): c.execute('INSERT INTO cua_commits VALUES (?, NULL, ?)', "
            "(i + 1, json.dumps([{'n': i}])))\n"
            "os._exit(0)\n"
        )
        subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
        assert Path(f"{path}-wal").stat().st_size > 0
    with _quiet():
        _reads(path, "sqlite")
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    c.close()


# --- damaged, empty, or not a file ----------------------------------------------------------


def _truncated_header(p: Path) -> None:
    p.write_bytes(b"SQLite format 3\x00" + b"\x10\x00")


def _garbage(p: Path) -> None:
    p.write_bytes(b"this is not a database, it is a text file\n" * 200)


def _zero_length(p: Path) -> None:
    p.write_bytes(b"")


def _garbage_after_our_header(p: Path) -> None:
    s = SqliteStorage(p)
    s.append([{"n": 1}])
    s.close()
    data = bytearray(p.read_bytes())
    data[100:4096] = os.urandom(4096 - 100)  # the schema page, after the header
    p.write_bytes(bytes(data))
    Path(f"{p}.lock").unlink()


DAMAGED = {
    "zero-length": (_zero_length, "empty file"),
    "garbage": (_garbage, "not a SQLite database"),
    "truncated-header": (_truncated_header, "not a SQLite database"),
    "damaged-schema-page": (_garbage_after_our_header, "not a usable SQLite log"),
}


@pytest.mark.parametrize(("make", "why"), DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_sqlite_file_is_a_corrupt_log_error_and_left_as_is(
    make: Callable[[Path], None], why: str, tmp_path: Path
) -> None:
    path = tmp_path / "log.sqlite"
    make(path)
    digest = sha(path)
    with pytest.raises(CorruptLogError, match=why) as err:
        SqliteStorage(path)
    assert str(path) in str(err.value)
    assert sha(path) == digest
    path.unlink()
    SqliteStorage(path).close()  # the failed open left no lock held


def test_a_damaged_commit_page_is_a_corrupt_log_error_at_load(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    s = SqliteStorage(path)
    for i in range(50):
        s.append([{"n": i, "pad": "x" * 200}])
    s.close()
    data = bytearray(path.read_bytes())
    page = 4096
    root = 2  # cua_commits was created first: its root is page 2
    data[page * (root - 1) : page * root] = b"\xff" * page
    path.write_bytes(bytes(data))
    digest = sha(path)
    s = SqliteStorage(path)
    with pytest.raises(CorruptLogError, match="damaged") as err:
        s.load()
    s.close()
    assert str(path) in str(err.value) and sha(path) == digest


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
@pytest.mark.parametrize("what", ["directory", "fifo", "missing-parent"])
def test_a_log_path_that_is_not_a_file_is_named(kind: str, what: str, tmp_path: Path) -> None:
    path = tmp_path / KINDS[kind][0]
    if what == "directory":
        path.mkdir()
        (path / "keep").write_text("x")
        match = "is a directory"
    elif what == "fifo":
        os.mkfifo(path)
        match = "is a FIFO"
    else:
        path = tmp_path / "no" / "such" / KINDS[kind][0]
        match = "does not exist"
    listing = tree(tmp_path)
    with pytest.raises(LogError, match=match):
        KINDS[kind][1](path)  # a FIFO must not hang the open (O_NONBLOCK)
    assert tree(tmp_path) == listing


# --- JSONL lines of the wrong shape or size -------------------------------------------------

BAD_LINES = {
    "not-json": (b'{"seq":2,"ep', "not valid JSON"),
    "invalid-utf8": (b'{"seq":2,"epoch":null,"ops":[{"a":"\xff"}]}', "not valid JSON"),
    "seq-string": (b'{"seq":"2","epoch":null,"ops":[]}', "seq is str"),
    "seq-float": (b'{"seq":2.0,"epoch":null,"ops":[]}', "seq is float"),
    "seq-bool": (b'{"seq":true,"epoch":null,"ops":[]}', "seq is bool"),
    "epoch-string": (b'{"seq":2,"epoch":"3","ops":[]}', "epoch is str"),
    "epoch-bool": (b'{"seq":2,"epoch":false,"ops":[]}', "epoch is bool"),
    "ops-object": (b'{"seq":2,"epoch":null,"ops":{}}', "ops is dict"),
    "ops-string": (b'{"seq":2,"epoch":null,"ops":"x"}', "ops is str"),
    "ops-missing": (b'{"seq":2,"epoch":null}', "ops is NoneType"),
    "ops-element-int": (b'{"seq":2,"epoch":null,"ops":[1]}', "not a JSON object"),
    "ops-element-list": (b'{"seq":2,"epoch":null,"ops":[[]]}', "not a JSON object"),
    "ops-element-null": (b'{"seq":2,"epoch":null,"ops":[{},null]}', "not a JSON object"),
    "top-level-list": (b"[1,2]", "not a commit record"),
    "wrong-seq": (b'{"seq":7,"epoch":null,"ops":[]}', "holds seq 7"),
}


@pytest.mark.parametrize(("line", "why"), BAD_LINES.values(), ids=BAD_LINES.keys())
def test_a_bad_middle_line_is_a_corrupt_log_error_naming_file_and_line(
    line: bytes, why: str, tmp_path: Path
) -> None:
    path = _log(tmp_path, "jsonl", commits=3)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + line + b"\n" + lines[2])
    digest = sha(path)
    with pytest.raises(CorruptLogError, match=why) as err:
        JsonlStorage(path)
    assert f"{path}: line 2" in str(err.value)
    assert sha(path) == digest  # reading never repairs damage


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = _log(tmp_path, "jsonl", commits=1)
    with path.open("ab") as f:
        f.write(b'{"seq":2,"epoch":null,"ops":[{"x":"')
        f.write(b"x" * (MAX_LINE_BYTES + 10))
        f.write(b'"}]}\n')
    digest = sha(path)
    with pytest.raises(CorruptLogError, match="longer than") as err:
        JsonlStorage(path)
    assert f"{path}: line 3" in str(err.value) and sha(path) == digest  # the identity's is 1


def test_a_huge_torn_tail_is_damage_not_a_torn_line(tmp_path: Path) -> None:
    """No append writes a line that long, so a crash cannot have torn one."""
    path = _log(tmp_path, "jsonl", commits=1)
    with path.open("ab") as f:
        f.write(b"y" * (MAX_LINE_BYTES + 1))
    digest = sha(path)
    with pytest.raises(CorruptLogError, match="longer than"):
        JsonlStorage(path)
    assert sha(path) == digest


def test_a_commit_over_the_line_limit_stores_nothing(tmp_path: Path) -> None:
    path = _log(tmp_path, "jsonl", commits=2)
    digest = sha(path)
    s = JsonlStorage(path)
    with pytest.raises(LogError, match="over the log's limit"):
        s.append([{"blob": "z" * MAX_LINE_BYTES}])
    assert s.append([{"n": 2}]) == 3  # the next commit takes the next seq
    s.close()
    assert sha(path) != digest
    _reads(path, "jsonl", commits=3)


# --- epochs a fence cannot store --------------------------------------------------------------

BAD_EPOCHS = {"2**63": 2**63, "-1": -1, "bool": True, "str": "1", "float": 1.0}


@pytest.mark.parametrize("epoch", BAD_EPOCHS.values(), ids=BAD_EPOCHS.keys())
@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_an_epoch_a_fence_cannot_store_is_a_config_error_before_any_file(
    epoch: object, kind: str, tmp_path: Path
) -> None:
    path = _log(tmp_path, kind)
    listing = tree(tmp_path)
    with pytest.raises(ConfigError, match="epoch"):
        if kind == "sqlite":
            open_fenced_sqlite(path, epoch)  # type: ignore[arg-type]
        else:
            FencedFileSystem(tmp_path / "fence", epoch)  # type: ignore[arg-type]
    assert tree(tmp_path) == listing
    _reads(path, kind)


def test_the_largest_epoch_is_stored_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    s, fence = open_fenced_sqlite(path, 2**63 - 1)
    s.append([{"n": 0}])
    assert fence.floor() == 2**63 - 1 and s.load()[0].epoch == 2**63 - 1
    s.close()


# --- the whole-file creation under concurrency ------------------------------------------------

CREATE_AND_APPEND = """
import sys, time
from durable_spaces.harness.log import open_fenced_sqlite
start = float(sys.argv[2])
while time.time() < start:
    pass
s, f = open_fenced_sqlite(sys.argv[1], 1)
s.append([{"pid": int(sys.argv[3])}])
s.close()
"""


def test_concurrent_creators_of_a_new_log_all_open_the_same_one(tmp_path: Path) -> None:
    """A new log is built under a temporary name and linked into place: creators racing
    for it never see each other's half-made file, and exactly one file results."""
    import subprocess
    import sys
    import time

    path = tmp_path / "log.sqlite"
    start = time.time() + 1.5
    procs = [
        subprocess.Popen([sys.executable, "-c", CREATE_AND_APPEND, str(path), str(start), str(i)])
        for i in range(6)
    ]
    assert [p.wait(60) for p in procs] == [0] * 6
    s = SqliteStorage(path)
    assert sorted(c.ops[0]["pid"] for c in s.load()) == list(range(6))
    s.close()
    assert sorted(os.listdir(tmp_path)) == ["log.sqlite", "log.sqlite.lock"]


READ_ALL = """
import json, sys
from durable_spaces.harness.log import open_fenced_sqlite
s, _ = open_fenced_sqlite(sys.argv[1], 1)
print(json.dumps([c.ops[0]["who"] for c in s.load()]))
s.close()
"""
APPEND_ONE = """
import sys
from durable_spaces.harness.log import open_fenced_sqlite
s, _ = open_fenced_sqlite(sys.argv[1], 1)
s.append([{"who": "child"}])
s.close()
"""


def test_checking_a_log_again_in_the_same_process_keeps_sqlites_locks(tmp_path: Path) -> None:
    """POSIX locks die with *any* close of the file in the process: the checks of a second
    open must not unlock the first one's connection (a process alone on the WAL then
    checkpoints and deletes it at close, and the first one's next commits vanish)."""
    import subprocess
    import sys

    path = tmp_path / "log.sqlite"
    first, _ = open_fenced_sqlite(path, 1)
    first.append([{"who": "first"}])
    for _ in range(3):
        again, _ = open_fenced_sqlite(path, 1)  # its checks open the file too
        again.close()
    subprocess.run([sys.executable, "-c", APPEND_ONE, str(path)], check=True, timeout=60)
    first.append([{"who": "first, again"}])
    # what another process reads now (as if this one were SIGKILLed before closing)
    read = subprocess.run(
        [sys.executable, "-c", READ_ALL, str(path)], check=True, timeout=60, capture_output=True
    )
    first.close()
    assert json.loads(read.stdout) == ["first", "child", "first, again"]
