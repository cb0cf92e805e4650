"""The SQLite log: WAL, one table of commits, the exact epoch fence in the same
transaction as each commit, and the checks that keep it off any database not its own
(``log_sqlite_file``: what is at the path, the schema, creating the file whole). With
that module, the only one that speaks SQL (``durable_spaces.harness.log`` says why).

The log's identity (``Storage.identity``) is the one row of ``cua_log``, written with
the schema into the file that is built whole, synced and only then linked into place:
no loss of unsynced commits can take it (a WAL at ``NORMAL`` that was never
checkpointed loses every commit, never the main file's first state). A log of schema 1
(before identities) gets its row on its first open, in a transaction synced at ``FULL``."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from durable_spaces.chaos import failpoints, mutants
from durable_spaces.errors import (
    CorruptLogError,
    FenceHaltedError,
    LogError,
    StaleEpochError,
)
from durable_spaces.harness.log_core import (
    Commit,
    Fence,
    LogOp,
    check_epoch,
    check_identity,
    dumps_ops,
    new_identity,
)
from durable_spaces.harness.log_files import OwnerLock, check_sidecar, hold, tighten, unhold
from durable_spaces.harness.log_sqlite_file import (
    APPLICATION_ID,
    BUSY_TIMEOUT_S,
    SCHEMA,
    SCHEMA_V1,
    SCHEMA_VERSION,
    check_synchronous,
    create_sqlite,
    inspect_sqlite,
    same_file,
    verify_schema,
)
from durable_spaces.host.bounded import parse_json

_NEXT_SEQ = "SELECT COALESCE(MAX(seq), 0) + 1 FROM cua_commits"


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
        self.synchronous = check_synchronous(synchronous)
        self.fence = fence
        self._mutex = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._fd: int | None = None
        self.identity = ""  # read once the file is known to be a log (``_setup_txn``)
        state = inspect_sqlite(self.path)  # refuses what is not ours before any write
        self._owner = OwnerLock(self.path, exclusive=exclusive)
        try:
            if state == "missing":
                create_sqlite(self.path)
                state = inspect_sqlite(self.path)  # whatever creator won, judged the same way
            fd = hold(self.path, "log")  # kept until close(), after the connection's
            try:
                for suffix in ("-wal", "-shm"):
                    check_sidecar(Path(f"{self.path}{suffix}"), f"log {suffix[1:]} file")
                conn = sqlite3.connect(
                    self.path,
                    isolation_level=None,
                    timeout=BUSY_TIMEOUT_S,
                    check_same_thread=False,
                )
                try:
                    same_file(conn, fd, self.path)
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
        verify_schema(conn, self.path)
        tighten(fd, self.path, "log")  # only now: it is ours
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]  # ours are: no write
        if str(mode).lower() != "wal":
            raise LogError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        if legacy:  # a log of an older version: mark it ours, checked again under the lock
            self._upgrade_txn(conn, f"PRAGMA application_id={APPLICATION_ID}")
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_V1:
            # Its identity (module doc), at FULL: synced before a later commit can be lost.
            conn.execute("PRAGMA synchronous=FULL")
            try:
                self._upgrade_txn(conn, SCHEMA["cua_log"], since=SCHEMA_V1)
            finally:
                conn.execute(f"PRAGMA synchronous={self.synchronous}")
        row = conn.execute("SELECT log_id FROM cua_log WHERE id = 1").fetchone()
        self.identity = check_identity(row[0] if row else None, str(self.path))
        for suffix in ("-wal", "-shm"):  # SQLite made them with the main file's mode
            check_sidecar(Path(f"{self.path}{suffix}"), f"log {suffix[1:]} file")

    def _upgrade_txn(self, conn: sqlite3.Connection, sql: str, since: int | None = None) -> None:
        """One write transaction that checks the schema again under the lock and runs
        ``sql``; with ``since``, only if the schema is still that version (another opener
        may have upgraded it meanwhile), and then adds the identity and the new version."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if since is None or version == since:
                verify_schema(conn, self.path)
                conn.execute(sql)
                if since is not None:
                    row = "INSERT INTO cua_log (id, log_id) VALUES (1, ?)"
                    conn.execute(row, (new_identity(),))
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

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
