"""The SQLite log: WAL, one table of commits, the exact epoch fence in the same
transaction as each commit, and the checks that keep it off any database not its own.
The only module that speaks SQL (see ``durable_spaces.harness.log`` for the reasons)."""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import stat
import threading
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Literal

from durable_spaces.chaos import failpoints, mutants
from durable_spaces.errors import (
    ConfigError,
    CorruptLogError,
    FenceHaltedError,
    ForeignDatabaseError,
    LogError,
    StaleEpochError,
)
from durable_spaces.harness.log_core import Commit, Fence, LogOp, check_epoch, dumps_ops
from durable_spaces.harness.log_files import (
    OwnerLock,
    adopt,
    check_sidecar,
    fsync_dir,
    hold,
    open_file,
    tighten,
    unhold,
)
from durable_spaces.host.bounded import parse_json

_SCHEMA_VERSION = 1
_BUSY_TIMEOUT_S = 30.0
_NEXT_SEQ = "SELECT COALESCE(MAX(seq), 0) + 1 FROM cua_commits"
#: ``PRAGMA application_id`` of every SQLite log this package creates ("DSlg").
APPLICATION_ID = 0x44536C67
_SQLITE_MAGIC = b"SQLite format 3\x00"
#: What link(2) answers on a filesystem without hard links (FUSE without link, vfat).
_NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EMLINK)
_SCHEMA = {
    "cua_commits": "CREATE TABLE cua_commits ("
    " seq INTEGER PRIMARY KEY, epoch INTEGER, ops TEXT NOT NULL)",
    "cua_fence": "CREATE TABLE cua_fence ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), floor INTEGER NOT NULL)",
}
#: ``PRAGMA table_info`` of our tables: (name, type, notnull, pk) per column.
_COLUMNS = {
    "cua_commits": [("seq", "INTEGER", 0, 1), ("epoch", "INTEGER", 0, 0), ("ops", "TEXT", 1, 0)],
    "cua_fence": [("id", "INTEGER", 0, 1), ("floor", "INTEGER", 1, 0)],
}


def _check_synchronous(synchronous: str) -> str:
    level = synchronous.upper()
    if level not in ("NORMAL", "FULL"):
        raise ConfigError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
    return level


def _uri(path: Path, query: str) -> str:
    return f"{Path(os.path.abspath(path)).as_uri()}?{query}"


def _table_names(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    """Every schema object as (type, name): tables, and any index, view or trigger."""
    return {(str(t), str(n)) for t, n in conn.execute("SELECT type, name FROM sqlite_master")}


def _inspect_sqlite(path: Path) -> Literal["missing", "ours", "legacy"]:
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
            _verify_schema(conn, path, rows=False)
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


def _create_sqlite(path: Path) -> None:
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
        conn = sqlite3.connect(tmp, isolation_level=None, timeout=_BUSY_TIMEOUT_S)
        try:
            _same_file(conn, fd, tmp)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")
            for sql in _SCHEMA.values():
                conn.execute(sql)
            conn.execute("INSERT INTO cua_fence (id, floor) VALUES (1, 0)")
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
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


def _same_file(conn: sqlite3.Connection, fd: int, path: Path) -> None:
    """SQLite opened the file we opened (``O_NOFOLLOW``): nothing swapped it in between."""
    row = conn.execute("PRAGMA database_list").fetchone()
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(row[2]))
    except (OSError, TypeError, IndexError):
        same = False
    if not same:
        raise LogError(f"log {path} was replaced while it was being opened; refusing it")


def _verify_schema(conn: sqlite3.Connection, path: Path, *, rows: bool = True) -> None:
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
    if names != {("table", t) for t in _SCHEMA}:
        held = ", ".join(sorted(f"{t} {n}" for t, n in names)) or "nothing"
        raise ForeignDatabaseError(
            f"{path} is a SQLite database that is not a durable-spaces log (it holds {held}); "
            "it is left untouched: point the log elsewhere"
        )
    for table, want in _COLUMNS.items():
        info = conn.execute(f"PRAGMA table_info({table})")
        cols = [(r[1], str(r[2]).upper(), r[3], r[5]) for r in info]
        if cols != want:
            raise ForeignDatabaseError(
                f"{path}: table {table} has columns {[c[0] for c in cols]}, not the log's; "
                "it is another program's database, left untouched"
            )
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version != _SCHEMA_VERSION:
        raise LogError(f"{path}: log schema {version}, expected {_SCHEMA_VERSION}")
    if rows and conn.execute("SELECT COUNT(*) FROM cua_fence WHERE id = 1").fetchone()[0] != 1:
        raise CorruptLogError(f"{path}: the fence row is missing")


class SqliteStorage:
    """A log in one SQLite file: WAL, one table of commits, every commit one transaction.

    ``exclusive=True`` (the default) makes this process the log's only owner;
    ``open_fenced_sqlite`` opens with ``exclusive=False`` because there the epoch fence,
    not the lock, keeps concurrent writers of different epochs apart. ``fence`` may be any
    ``Fence`` (checked inside the write transaction); the ``SqliteFence`` of this file is
    checked and raised in that same transaction.

    What is at ``path`` is checked before anything is written (see "files on disk"
    above): ``LogError`` for a symlink, a directory or a missing directory,
    ``CorruptLogError`` for an empty or damaged file, ``ForeignDatabaseError`` for another
    program's database; each names the file and leaves it as it was.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["NORMAL", "FULL"] | str = "NORMAL",
        fence: Fence | None = None,
        exclusive: bool = True,
    ) -> None:
        self.path = Path(path)
        self.synchronous = _check_synchronous(synchronous)
        self.fence = fence
        self._mutex = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._fd: int | None = None
        state = _inspect_sqlite(self.path)  # refuses what is not ours before any write
        self._owner = OwnerLock(self.path, exclusive=exclusive)
        try:
            if state == "missing":
                _create_sqlite(self.path)
                state = _inspect_sqlite(self.path)  # whatever creator won, judged the same way
            fd = hold(self.path, "log")  # kept until close(), after the connection's
            try:
                for suffix in ("-wal", "-shm"):
                    check_sidecar(Path(f"{self.path}{suffix}"), f"log {suffix[1:]} file")
                conn = sqlite3.connect(
                    self.path,
                    isolation_level=None,
                    timeout=_BUSY_TIMEOUT_S,
                    check_same_thread=False,
                )
                try:
                    _same_file(conn, fd, self.path)
                    self._setup_txn(conn, fd, legacy=state == "legacy")
                except BaseException:
                    conn.close()
                    raise
            except BaseException:
                unhold(fd)
                raise
            self._conn, self._fd = conn, fd
        except sqlite3.DatabaseError as e:
            self._owner.release()
            raise CorruptLogError(f"{self.path} is not a usable SQLite log: {e}") from e
        except BaseException:
            self._owner.release()
            raise

    def _setup_txn(self, conn: sqlite3.Connection, fd: int, *, legacy: bool) -> None:
        _verify_schema(conn, self.path)
        tighten(fd, self.path, "log")  # only now: it is ours
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]  # ours are: no write
        if str(mode).lower() != "wal":
            raise LogError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        if legacy:  # a log of an older version: mark it ours, checked again under the lock
            conn.execute("BEGIN IMMEDIATE")
            try:
                _verify_schema(conn, self.path)
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        for suffix in ("-wal", "-shm"):  # SQLite made them with the main file's mode
            check_sidecar(Path(f"{self.path}{suffix}"), f"log {suffix[1:]} file")

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LogError(f"log {self.path} is closed")
        return self._conn

    def load(self) -> list[Commit]:
        with self._mutex:
            commits = []
            try:
                rows = self._db.execute("SELECT seq, epoch, ops FROM cua_commits ORDER BY seq")
                for seq, epoch, text in rows:
                    commits.append(Commit(seq, self._ops(seq, epoch, text), epoch))
            except sqlite3.DatabaseError as e:
                if isinstance(e, sqlite3.OperationalError):
                    raise LogError(f"{self.path}: reading the log failed: {e}") from e
                raise CorruptLogError(f"{self.path} is damaged: {e}") from e
            return commits

    def _ops(self, seq: object, epoch: object, text: object) -> list[LogOp]:
        if epoch is not None and type(epoch) is not int:
            raise CorruptLogError(f"{self.path}: commit {seq} has epoch {epoch!r}, not an integer")
        try:
            ops = parse_json(text, where=f"commit {seq}", max_depth=None)  # type: ignore[arg-type]
        except (TypeError, ValueError) as e:
            raise CorruptLogError(f"{self.path}: commit {seq} is not valid JSON: {e}") from e
        if not isinstance(ops, list) or not all(isinstance(o, dict) for o in ops):
            raise CorruptLogError(f"{self.path}: commit {seq} is not a list of JSON objects")
        return ops

    def append(self, ops: Sequence[LogOp]) -> int:
        text = dumps_ops(ops)
        with self._mutex:
            conn = self._db
            fence = self.fence
            if fence is not None and fence.halted:
                raise FenceHaltedError("log")
            conn.execute("BEGIN IMMEDIATE")
            try:
                epoch = self._fence_txn(conn, fence)
                (seq,) = conn.execute(_NEXT_SEQ).fetchone()
                conn.execute(
                    "INSERT INTO cua_commits (seq, epoch, ops) VALUES (?, ?, ?)", (seq, epoch, text)
                )
                failpoints.hit("log.before_commit")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        failpoints.hit("log.after_commit")
        return int(seq)

    def _fence_txn(self, conn: sqlite3.Connection, fence: Fence | None) -> int | None:
        """Inside the caller's write transaction: refuse a stale epoch, raise the floor."""
        if fence is None:
            return None
        if isinstance(fence, SqliteFence) and fence.storage is self:
            floor = _read_floor_txn(conn)
            if fence.epoch < floor and not mutants.active("unfenced_log"):
                raise StaleEpochError(fence.epoch, floor, "log")
            if fence.epoch > floor:
                conn.execute("UPDATE cua_fence SET floor = ? WHERE id = 1", (fence.epoch,))
        else:
            fence.check()
        return fence.epoch

    def _floor(self) -> int:
        with self._mutex:
            return _read_floor_txn(self._db)

    def _advance(self, epoch: int) -> None:
        with self._mutex:
            conn = self._db
            conn.execute("BEGIN IMMEDIATE")
            try:
                floor = _read_floor_txn(conn)
                if epoch < floor:
                    raise StaleEpochError(epoch, floor, "log")
                conn.execute("UPDATE cua_fence SET floor = ? WHERE id = 1", (epoch,))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._fd is not None:  # only after the connection: see ``hold``
                unhold(self._fd)
                self._fd = None
            self._owner.release()

    def __enter__(self) -> SqliteStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_floor_txn(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT floor FROM cua_fence WHERE id = 1").fetchone()
    return int(row[0]) if row else 0


class SqliteFence:
    """The exact fence of a SQLite log: a one-row floor table read in every commit's
    transaction. ``check()`` is a quick separate read for callers outside a commit (the
    wrapped tools, the stream); the refusal that matters happens inside ``append``."""

    def __init__(self, storage: SqliteStorage, epoch: int) -> None:
        self.storage = storage
        self.epoch = check_epoch(epoch)
        self._halted: str | None = None

    def floor(self) -> int:
        return self.storage._floor()

    def check(self) -> None:
        if self._halted is not None:
            raise FenceHaltedError("log")
        floor = self.floor()
        if floor > self.epoch and not mutants.active("unfenced_log"):
            raise StaleEpochError(self.epoch, floor, "log")

    def advance(self) -> None:
        """Raise the floor to this epoch now (a new driver cuts off older ones at start),
        or raise ``StaleEpochError`` if a newer epoch already holds it."""
        if self._halted is not None:
            raise FenceHaltedError("log")
        self.storage._advance(self.epoch)

    def halt(self, reason: str = "") -> None:
        self._halted = reason

    @property
    def halted(self) -> bool:
        return self._halted is not None


def open_fenced_sqlite(
    path: str | os.PathLike[str],
    epoch: int,
    *,
    synchronous: Literal["NORMAL", "FULL"] | str = "NORMAL",
) -> tuple[SqliteStorage, SqliteFence]:
    """Open a SQLite log fenced at ``epoch``: each append reads the floor in its own
    transaction, refuses itself (``StaleEpochError``, nothing stored) when the floor is
    higher, and raises the floor when lower. Opening below the floor is allowed (so a
    stale driver can learn it is stale); its ``fence.check()`` and first append fail."""
    check_epoch(epoch)
    storage = SqliteStorage(path, synchronous=synchronous, exclusive=False)
    fence = SqliteFence(storage, epoch)
    storage.fence = fence
    return storage, fence
