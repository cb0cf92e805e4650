"""The SQLite log's file: what is at a log's path, creating a log whole, and its schema
(which tables, which columns, which version). ``log_sqlite`` opens and writes it; this
module and that one are the only ones that speak SQL (``durable_spaces.harness.log``).

Schema 2 adds ``cua_log``, the log's identity (``Storage.identity``): one row written
with the rest of the schema into the file that ``_create_sqlite`` builds whole, synced
before it is linked into place, so no later loss of unsynced commits can take it. A log
of schema 1 is still a log of ours (``log_sqlite`` gives it its identity on open)."""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import stat
from contextlib import suppress
from pathlib import Path
from typing import Literal

from durable_spaces.errors import (
    ConfigError,
    CorruptLogError,
    ForeignDatabaseError,
    LogError,
)
from durable_spaces.harness.log_core import new_identity
from durable_spaces.harness.log_files import adopt, fsync_dir, hold, open_file, unhold

SCHEMA_VERSION = 2
#: The schema before logs had an identity: migrated on open (module doc).
SCHEMA_V1 = 1
BUSY_TIMEOUT_S = 30.0
#: ``PRAGMA application_id`` of every SQLite log this package creates ("DSlg").
APPLICATION_ID = 0x44536C67
_SQLITE_MAGIC = b"SQLite format 3\x00"
#: What link(2) answers on a filesystem without hard links (FUSE without link, vfat).
_NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EMLINK)
SCHEMA = {
    "cua_commits": "CREATE TABLE cua_commits ("
    " seq INTEGER PRIMARY KEY, epoch INTEGER, ops TEXT NOT NULL)",
    "cua_fence": "CREATE TABLE cua_fence ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), floor INTEGER NOT NULL)",
    "cua_log": "CREATE TABLE cua_log ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), log_id TEXT NOT NULL)",
}
#: The tables of each schema version.
_TABLES = {SCHEMA_V1: {"cua_commits", "cua_fence"}, SCHEMA_VERSION: set(SCHEMA)}
#: ``PRAGMA table_info`` of our tables: (name, type, notnull, pk) per column.
_COLUMNS = {
    "cua_commits": [("seq", "INTEGER", 0, 1), ("epoch", "INTEGER", 0, 0), ("ops", "TEXT", 1, 0)],
    "cua_fence": [("id", "INTEGER", 0, 1), ("floor", "INTEGER", 1, 0)],
    "cua_log": [("id", "INTEGER", 0, 1), ("log_id", "TEXT", 1, 0)],
}


def check_synchronous(synchronous: str) -> str:
    level = synchronous.upper()
    if level not in ("NORMAL", "FULL"):
        raise ConfigError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
    return level


def _uri(path: Path, query: str) -> str:
    return f"{Path(os.path.abspath(path)).as_uri()}?{query}"


def _table_names(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    """Every schema object as (type, name): tables, and any index, view or trigger."""
    return {(str(t), str(n)) for t, n in conn.execute("SELECT type, name FROM sqlite_master")}


def inspect_sqlite(path: Path) -> Literal["missing", "ours", "legacy"]:
    """What is at ``path``, read without writing a byte there (no lock, no ``-shm``):
    missing, a log of ours (our application_id), or a log of an older version (none, and
    nothing that says otherwise). Raises for a symlink, a directory, an empty file or one
    that is not SQLite (``CorruptLogError``), another program's database
    (``ForeignDatabaseError``)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise LogError(f"log {path}: its directory {path.parent} does not exist") from None
        return "missing"
    fd = hold(path, "log")  # never a close beside a live connection: see ``hold``
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 100, 0)
    finally:
        unhold(fd)
    if size == 0:
        raise CorruptLogError(
            f"{path} is an empty file, not a SQLite log (durable-spaces creates a log whole, "
            "never empty); remove it if no other program owns it"
        )
    if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
        raise CorruptLogError(f"{path} is not a SQLite database (no SQLite header); left as is")
    app = int.from_bytes(head[68:72], "big", signed=True)
    if app == APPLICATION_ID:
        return "ours"  # its schema is checked by the real connection, under SQLite's locks
    if app != 0:
        raise ForeignDatabaseError(
            f"{path} is another program's SQLite database (application_id {app:#x}); "
            "it is left untouched: point the log elsewhere"
        )
    if head[18] != 2:
        raise ForeignDatabaseError(
            f"{path} is a SQLite database in rollback-journal mode, not a durable-spaces log "
            "(those are always WAL); it is left untouched"
        )
    # An older log, or another program's WAL database. Refuse it here only on evidence
    # read without side effects (immutable=1 reads the main file alone and creates
    # nothing); what cannot be read so (a damaged page, a page being checkpointed) is
    # judged by the real connection before its first write (``_verify_schema`` again).
    try:
        conn = sqlite3.connect(_uri(path, "immutable=1"), uri=True)
        try:
            if not _table_names(conn) and _has_wal(path):
                # an older log killed before its first checkpoint: the schema is in the WAL,
                # which only a (read-only) reader of the WAL sees
                conn.close()
                conn = sqlite3.connect(_uri(path, "mode=ro"), uri=True)
            verify_schema(conn, path, rows=False)
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        pass
    return "legacy"


def _has_wal(path: Path) -> bool:
    try:
        st = os.lstat(f"{path}-wal")
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def create_sqlite(path: Path) -> None:
    """Create the log at ``path`` whole: build it under ``.<name>.init`` (serialized by a
    flock on that file), then hard-link it into place, which never replaces a file that
    appeared meanwhile. A creator killed midway leaves only the temporary file, which the
    next creator rebuilds; the log path never holds a half-made database."""
    tmp = path.with_name(f".{path.name}.init")
    fd, _ = open_file(tmp, os.O_RDWR, what="log (being created)", create=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        mine = os.fstat(fd)
        if os.path.lexists(path):  # another creator won; drop our stray temporary file
            with suppress(FileNotFoundError):
                if os.path.samestat(mine, os.lstat(tmp)) and not os.path.samestat(
                    mine, os.stat(path)
                ):
                    os.unlink(tmp)
            return
        os.ftruncate(fd, 0)
        for suffix in ("-wal", "-shm", "-journal"):  # a killed creator's; none is in use
            with suppress(FileNotFoundError):
                os.unlink(f"{tmp}{suffix}")
        conn = sqlite3.connect(tmp, isolation_level=None, timeout=BUSY_TIMEOUT_S)
        try:
            same_file(conn, fd, tmp)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")
            for sql in SCHEMA.values():
                conn.execute(sql)
            conn.execute("INSERT INTO cua_fence (id, floor) VALUES (1, 0)")
            conn.execute("INSERT INTO cua_log (id, log_id) VALUES (1, ?)", (new_identity(),))
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        finally:
            conn.close()  # the last connection checkpoints: everything is in the main file
        os.fsync(fd)
        for suffix in ("-wal", "-shm"):  # a WAL without its database: SQLite would replay
            with suppress(FileNotFoundError):  # it into the new one
                os.unlink(f"{path}{suffix}")
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            pass  # an older version created it meanwhile: _inspect_sqlite judges it
        except OSError as e:
            if e.errno not in _NO_HARD_LINKS:
                raise
            if not os.path.lexists(path):  # no hard links here: rename (not atomic-exclusive)
                os.rename(tmp, path)
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        fsync_dir(path.parent)
    finally:
        # the file may be the log now, opened by another thread of this process: unlock
        # the creators waiting on it, and close it only as a held descriptor (``hold``)
        fcntl.flock(fd, fcntl.LOCK_UN)
        unhold(adopt(fd))


def same_file(conn: sqlite3.Connection, fd: int, path: Path) -> None:
    """SQLite opened the file we opened (``O_NOFOLLOW``): nothing swapped it in between."""
    row = conn.execute("PRAGMA database_list").fetchone()
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(row[2]))
    except (OSError, TypeError, IndexError):
        same = False
    if not same:
        raise LogError(f"log {path} was replaced while it was being opened; refusing it")


def verify_schema(conn: sqlite3.Connection, path: Path, *, rows: bool = True) -> None:
    """Reads only: the database ``conn`` sees is a log of ours (our application_id or
    none, exactly our tables and columns, our schema version and, with ``rows``, the
    fence row)."""
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    if app not in (0, APPLICATION_ID):
        raise ForeignDatabaseError(
            f"{path} is another program's SQLite database (application_id {app:#x}); "
            "it is left untouched: point the log elsewhere"
        )
    names = _table_names(conn)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = _TABLES.get(version, set(SCHEMA))
    if names != {("table", t) for t in tables}:
        held = ", ".join(sorted(f"{t} {n}" for t, n in names)) or "nothing"
        raise ForeignDatabaseError(
            f"{path} is a SQLite database that is not a durable-spaces log (it holds {held}); "
            "it is left untouched: point the log elsewhere"
        )
    for table in sorted(tables):
        info = conn.execute(f"PRAGMA table_info({table})")
        cols = [(r[1], str(r[2]).upper(), r[3], r[5]) for r in info]
        if cols != _COLUMNS[table]:
            raise ForeignDatabaseError(
                f"{path}: table {table} has columns {[c[0] for c in cols]}, not the log's; "
                "it is another program's database, left untouched"
            )
    if version not in _TABLES:
        raise LogError(f"{path}: log schema {version}, expected {SCHEMA_VERSION}")
    if rows and conn.execute("SELECT COUNT(*) FROM cua_fence WHERE id = 1").fetchone()[0] != 1:
        raise CorruptLogError(f"{path}: the fence row is missing")
