"""The durable log: one line of atomic commits, and the epoch fence that guards it.

A log is a sequence of commits; a commit is a list of JSON operations (entries,
documents, task state, submissions) that the harness interprets. The storage knows
nothing of their meaning: it only promises that a commit is stored whole or not at all,
in order, and that nothing is visible before it is stored. Reopening a storage replays
its commits. This module is the only one that speaks SQL.

Storages: ``MemoryStorage`` (tests), SQLite (WAL; exact fence), JSONL (append-only,
fsync per commit; best-effort fence with marker files).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sqlite3
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from durable_spaces.chaos import failpoints
from durable_spaces.errors import (
    ConfigError,
    CorruptLogError,
    FenceHaltedError,
    LogError,
    StaleEpochError,
    StorageLockedError,
    TornTailWarning,
)

Op = dict[str, Any]


@dataclass(frozen=True)
class Commit:
    """One stored commit: its position in the line, the epoch that wrote it, its ops."""

    seq: int
    ops: list[Op]
    epoch: int | None = None


@runtime_checkable
class Fence(Protocol):
    """An epoch floor shared by every writer of one log."""

    epoch: int

    def floor(self) -> int:
        """The current floor (the highest epoch that has written or raised it)."""
        ...

    def check(self) -> None:
        """Raise ``StaleEpochError`` if a newer epoch has raised the floor (or halted)."""
        ...

    def halt(self, reason: str = "") -> None:
        """Refuse every later commit of this writer (the driver's halt path)."""
        ...

    @property
    def halted(self) -> bool: ...


@runtime_checkable
class Storage(Protocol):
    """An append-only line of atomic commits."""

    def load(self) -> list[Commit]:
        """Every stored commit, in order."""
        ...

    def append(self, ops: Sequence[Op]) -> int:
        """Store one commit atomically and durably (per the storage's sync level);
        return its seq. A fenced storage raises ``StaleEpochError`` and stores nothing."""
        ...

    def close(self) -> None: ...


@dataclass
class MemoryFence:
    """A fence in memory (tests; several writers in one process share one floor)."""

    epoch: int
    _floor: list[int] = field(default_factory=lambda: [0])
    _halted: bool = False

    def floor(self) -> int:
        return self._floor[0]

    def check(self) -> None:
        if self._halted:
            raise FenceHaltedError("memory")
        if self._floor[0] > self.epoch:
            raise StaleEpochError(self.epoch, self._floor[0], "log")
        self._floor[0] = self.epoch

    def halt(self, reason: str = "") -> None:
        self._halted = True

    @property
    def halted(self) -> bool:
        return self._halted

    def writer(self, epoch: int) -> MemoryFence:
        """Another writer of the same log, at ``epoch``."""
        return MemoryFence(epoch, self._floor)


class MemoryStorage:
    """Commits kept in memory: for tests and transient agents; gone with the process."""

    def __init__(self, fence: Fence | None = None) -> None:
        self._commits: list[Commit] = []
        self._lock = threading.Lock()
        self.fence = fence

    def load(self) -> list[Commit]:
        with self._lock:
            return list(self._commits)

    def append(self, ops: Sequence[Op]) -> int:
        with self._lock:
            if self.fence is not None:
                self.fence.check()
            seq = len(self._commits) + 1
            epoch = self.fence.epoch if self.fence is not None else None
            self._commits.append(Commit(seq, [dict(o) for o in ops], epoch))
            return seq

    def close(self) -> None:
        pass


# --- files on disk ------------------------------------------------------------------------
#
# Why these choices (the reasoning the code below keeps):
#
# - One owner per storage. Two processes appending to one log without coordination is
#   silent corruption (SQLite would serialize them, but two harnesses would interleave
#   their commits; two JSONL writers would reuse seqs). So an unfenced storage takes an
#   exclusive ``flock`` on a sidecar ``<path>.lock`` for its whole life and a second
#   opener gets ``StorageLockedError``. The kernel drops the lock when the owner dies,
#   so a SIGKILLed driver never leaves a stale lock behind (a pid file would).
# - A fenced log is the exception: during a takeover a stale driver (older epoch) and
#   the new one are both alive and both open the file. There the *fence* is what keeps
#   the line consistent, so fenced opens take the sidecar lock *shared*: any number of
#   fenced writers together, but never alongside an unfenced exclusive owner.
# - SQLite (WAL, ``BEGIN IMMEDIATE``) is the exact fence: the floor is read and raised in
#   the same write transaction as the commit, so a stale commit is refused atomically.
#   ``synchronous=NORMAL`` survives any process crash; after a power loss the last few
#   commits may roll back (never tear). ``FULL`` syncs the WAL on every commit.
# - JSONL is one ``os.write`` of a whole line plus ``fsync`` per commit. A crash can tear
#   only the last line; that is reported and truncated before the next append. Anything
#   wrong before the last line is damage, never skipped silently.
# - Failpoints: ``log.before_commit`` fires when a commit is built but not yet stored
#   (SQLite: inside the transaction; JSONL: before the write), ``log.after_commit`` right
#   after it is durable. A kill at the first loses the commit whole; at the second keeps it.
#   ``log.short_write`` (JSONL) fires after a write that stored only part of a line.

_FILE_MODE = 0o600
_DIR_MODE = 0o700
_SCHEMA_VERSION = 1
_BUSY_TIMEOUT_S = 30.0
_NEXT_SEQ = "SELECT COALESCE(MAX(seq), 0) + 1 FROM cua_commits"


def _dumps(ops: Sequence[Op]) -> tuple[list[Op], str]:
    """Copy and serialize ops *before* anything is stored (a bad op stores nothing)."""
    copied = [dict(o) for o in ops]
    return copied, json.dumps(copied, separators=(",", ":"))


def _create_private(path: Path) -> bool:
    """Create ``path`` with mode 0600 if missing; return whether it was created."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, _FILE_MODE)
    except FileExistsError:
        return False
    os.close(fd)
    _fsync_dir(path.parent)
    return True


def _fsync_dir(directory: Path) -> None:
    """Make a new directory entry durable (a fresh file is not durable until its dir is)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _OwnerLock:
    """An advisory ``flock`` on ``<path>.lock``, held until ``release()`` or process death."""

    def __init__(self, path: Path, *, exclusive: bool) -> None:
        self.path = Path(f"{path}.lock")
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, _FILE_MODE)
        try:
            fcntl.flock(self._fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(self._fd)
            self._fd = None
            if exclusive:
                why = f"is already open{holder}; one process owns a log at a time"
            else:
                why = f"is owned exclusively{holder}; fenced writers must wait"
            raise StorageLockedError(
                f"log {path} {why} until that process closes it or exits (lock file {self.path})"
            ) from None
        self._exclusive = exclusive
        if exclusive:  # only the sole owner may write its pid into the lock file
            os.ftruncate(self._fd, 0)
            os.write(self._fd, f"{os.getpid()}\n".encode())

    def _holder(self) -> str:
        """Who holds the lock, for the message: the pid an exclusive owner wrote, if alive."""
        assert self._fd is not None
        try:
            pid = int(os.pread(self._fd, 32, 0).decode().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return " by another process"
        return " in this process" if pid == os.getpid() else f" by process {pid}"

    def release(self) -> None:
        if self._fd is not None:
            if self._exclusive:
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def _check_synchronous(synchronous: str) -> str:
    level = synchronous.upper()
    if level not in ("NORMAL", "FULL"):
        raise ConfigError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
    return level


class SqliteStorage:
    """A log in one SQLite file: WAL, one table of commits, every commit one transaction.

    ``exclusive=True`` (the default) makes this process the log's only owner;
    ``open_fenced_sqlite`` opens with ``exclusive=False`` because there the epoch fence,
    not the lock, keeps concurrent writers of different epochs apart. ``fence`` may be any
    ``Fence`` (checked inside the write transaction); the ``SqliteFence`` of this file is
    checked and raised in that same transaction.
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
        self._owner = _OwnerLock(self.path, exclusive=exclusive)
        try:
            _create_private(self.path)
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                self.path, isolation_level=None, timeout=_BUSY_TIMEOUT_S, check_same_thread=False
            )
            try:
                self._setup_txn(self._conn)
            except BaseException:
                self._conn.close()
                raise
        except sqlite3.DatabaseError as e:
            self._owner.release()
            raise CorruptLogError(f"{self.path} is not a usable SQLite log: {e}") from e
        except BaseException:
            self._owner.release()
            raise

    def _setup_txn(self, conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LogError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS cua_commits ("
                " seq INTEGER PRIMARY KEY, epoch INTEGER, ops TEXT NOT NULL)"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS cua_fence ("
                " id INTEGER PRIMARY KEY CHECK (id = 1), floor INTEGER NOT NULL)"
            )
            conn.execute("INSERT OR IGNORE INTO cua_fence (id, floor) VALUES (1, 0)")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
            elif version != _SCHEMA_VERSION:
                raise LogError(f"{self.path}: log schema {version}, expected {_SCHEMA_VERSION}")
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
            rows = self._db.execute("SELECT seq, epoch, ops FROM cua_commits ORDER BY seq")
            commits = []
            for seq, epoch, text in rows:
                try:
                    ops = json.loads(text)
                except ValueError as e:
                    msg = f"{self.path}: commit {seq} is not valid JSON: {e}"
                    raise CorruptLogError(msg) from e
                commits.append(Commit(seq, ops, epoch))
            return commits

    def append(self, ops: Sequence[Op]) -> int:
        _, text = _dumps(ops)
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
            if fence.epoch < floor:
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
        self.epoch = epoch
        self._halted: str | None = None

    def floor(self) -> int:
        return self.storage._floor()

    def check(self) -> None:
        if self._halted is not None:
            raise FenceHaltedError("log")
        floor = self.floor()
        if floor > self.epoch:
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
    storage = SqliteStorage(path, synchronous=synchronous, exclusive=False)
    fence = SqliteFence(storage, epoch)
    storage.fence = fence
    return storage, fence


# --- JSONL --------------------------------------------------------------------------------


class JsonlStorage:
    """An append-only JSON-lines log: ``{"seq":..,"epoch":..,"ops":[..]}`` per line, one
    ``write`` and ``fsync`` per commit.

    A torn last line (a crash mid-append) is ignored, reported in ``torn_tail`` and a
    ``TornTailWarning``, and truncated away before the next append. A bad line anywhere
    else raises ``CorruptLogError`` naming the file and line. Appends and reads take a
    ``flock`` on the log file itself, so fenced writers sharing the file never see each
    other's half-written lines and always append at the next seq.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fence: Fence | None = None,
        exclusive: bool = True,
    ) -> None:
        self.path = Path(path)
        self.fence = fence
        self.torn_tail: str | None = None
        self._mutex = threading.Lock()
        self._commits: list[Commit] = []
        self._size = 0  # bytes of whole, parsed lines
        self._owner = _OwnerLock(self.path, exclusive=exclusive)
        try:
            _create_private(self.path)
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_APPEND)
            try:
                with self._flocked(fcntl.LOCK_SH):
                    self._catch_up_locked(repair=False)
            except BaseException:
                os.close(self._fd)
                raise
        except BaseException:
            self._owner.release()
            raise

    @property
    def _file(self) -> int:
        if self._fd is None:
            raise LogError(f"log {self.path} is closed")
        return self._fd

    @contextmanager
    def _flocked(self, how: int) -> Iterator[int]:
        fd = self._file
        fcntl.flock(fd, how)
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _catch_up_locked(self, *, repair: bool) -> None:
        """Read lines appended since ``_size`` (by us or a fellow fenced writer); with
        ``repair``, truncate a torn tail away. Caller holds the file's flock."""
        fd = self._file
        size = os.fstat(fd).st_size
        if size < self._size:
            raise CorruptLogError(f"{self.path} shrank from {self._size} to {size} bytes")
        if size > self._size:
            data = os.pread(fd, size - self._size, self._size)
            torn, self.torn_tail = self.torn_tail, self._parse(data)
            if self.torn_tail is not None and self.torn_tail != torn:
                warnings.warn(
                    f"{self.path}: ignoring a torn last line ({self.torn_tail}); it is truncated "
                    "before the next append",
                    TornTailWarning,
                    stacklevel=3,
                )
        if repair and os.fstat(fd).st_size > self._size:
            os.ftruncate(fd, self._size)
            os.fsync(fd)

    def _parse(self, data: bytes) -> str | None:
        """Append the commits in ``data`` (bytes after ``_size``); return the torn tail."""
        lines = data.split(b"\n")
        whole, rest = lines[:-1], lines[-1]
        for i, raw in enumerate(whole):
            lineno = len(self._commits) + 1
            try:
                obj = json.loads(raw)
            except ValueError as e:
                if i == len(whole) - 1 and not rest:
                    return f"line {lineno}: unparsable ({e})"
                raise CorruptLogError(
                    f"{self.path}: line {lineno} is not valid JSON ({e}); the log is damaged "
                    "before its last line"
                ) from e
            self._commits.append(self._commit(obj, lineno))
            self._size += len(raw) + 1
        if rest:
            return f"line {len(self._commits) + 1}: {len(rest)} bytes without a newline"
        return None

    def _commit(self, obj: Any, lineno: int) -> Commit:
        ok = (
            isinstance(obj, dict)
            and isinstance(obj.get("seq"), int)
            and isinstance(obj.get("ops"), list)
            and (obj.get("epoch") is None or isinstance(obj.get("epoch"), int))
        )
        if not ok:
            raise CorruptLogError(f"{self.path}: line {lineno} is not a commit record")
        if obj["seq"] != lineno:
            raise CorruptLogError(f"{self.path}: line {lineno} holds seq {obj['seq']}")
        return Commit(obj["seq"], obj["ops"], obj.get("epoch"))

    def load(self) -> list[Commit]:
        """Every commit, in order (kept in memory: treat the returned ops as read-only)."""
        with self._mutex, self._flocked(fcntl.LOCK_SH):
            self._catch_up_locked(repair=False)
            return list(self._commits)

    def append(self, ops: Sequence[Op]) -> int:
        _, text = _dumps(ops)
        stored = json.loads(text)  # what a reopen will read (deep, tuples become lists)
        with self._mutex, self._flocked(fcntl.LOCK_EX) as fd:
            fence = self.fence
            if fence is not None:
                if fence.halted:
                    raise FenceHaltedError("log")
                fence.check()
            self._catch_up_locked(repair=True)
            seq = len(self._commits) + 1
            epoch = fence.epoch if fence is not None else None
            line = f'{{"seq":{seq},"epoch":{json.dumps(epoch)},"ops":{text}}}\n'.encode()
            failpoints.hit("log.before_commit")
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                    if view:  # a short write (disk full, file size limit): a line half out
                        failpoints.hit("log.short_write")
                os.fsync(fd)
            except BaseException:
                os.ftruncate(fd, self._size)  # a failed write (ENOSPC) leaves no torn line
                raise
            self._commits.append(Commit(seq, stored, epoch))
            self._size += len(line)
            self.torn_tail = None
        failpoints.hit("log.after_commit")
        return seq

    def close(self) -> None:
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._owner.release()

    def __enter__(self) -> JsonlStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_MARKER = re.compile(r"^epoch-(\d+)$")


class FencedFileSystem:
    """A best-effort fence for a log on a plain filesystem: one ``epoch-<n>`` marker file
    per epoch in ``directory``; the floor is the highest marker.

    ``check()`` refuses when a higher marker exists and otherwise creates this epoch's
    marker (which raises the floor for everyone older). A filesystem has no transaction
    spanning the check and the write it guards: a stale writer that passed its check just
    before a newer epoch created its marker can still land one write, and learns of the
    refusal on its next check. ``JsonlStorage`` narrows this by checking under the log
    file's lock, but a marker created outside an append (``advance()`` at a driver's start)
    can still race. Prefer SQLite (``open_fenced_sqlite``) where exactness matters.
    """

    def __init__(self, directory: str | os.PathLike[str], epoch: int) -> None:
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, not {epoch}")
        self.directory = Path(directory)
        self.directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        self.epoch = epoch
        self._halted: str | None = None

    def floor(self) -> int:
        epochs = [int(m[1]) for p in os.listdir(self.directory) if (m := _MARKER.match(p))]
        return max(epochs, default=0)

    def check(self) -> None:
        if self._halted is not None:
            raise FenceHaltedError("log")
        floor = self.floor()
        if floor > self.epoch:
            raise StaleEpochError(self.epoch, floor, "log")
        marker = self.directory / f"epoch-{self.epoch}"
        if floor < self.epoch and _create_private(marker):
            floor = self.floor()  # a newer epoch may have arrived meanwhile
            if floor > self.epoch:
                raise StaleEpochError(self.epoch, floor, "log")

    def advance(self) -> None:
        """Raise the floor to this epoch now (same as ``check()``: it creates the marker)."""
        self.check()

    def halt(self, reason: str = "") -> None:
        self._halted = reason

    @property
    def halted(self) -> bool:
        return self._halted is not None


def open_fenced_jsonl(
    path: str | os.PathLike[str],
    epoch: int,
    *,
    fence_dir: str | os.PathLike[str] | None = None,
) -> tuple[JsonlStorage, FencedFileSystem]:
    """Open a JSONL log fenced at ``epoch`` by marker files in ``fence_dir`` (default
    ``<path>.fence/``). Best effort: see ``FencedFileSystem`` for the window."""
    fence = FencedFileSystem(fence_dir if fence_dir is not None else f"{path}.fence", epoch)
    return JsonlStorage(path, fence=fence, exclusive=False), fence


def open_storage(
    url_or_path: str | os.PathLike[str],
    *,
    synchronous: Literal["NORMAL", "FULL"] | str = "NORMAL",
) -> Storage:
    """Open an unfenced, exclusively owned storage from ``sqlite:PATH``, ``jsonl:PATH`` or
    ``memory:`` (``sqlite:///abs`` also works). A bare path picks JSONL for ``*.jsonl``
    and SQLite otherwise."""
    text = os.fspath(url_or_path)
    scheme, sep, rest = text.partition(":")
    if not sep or scheme not in ("sqlite", "jsonl", "memory"):
        scheme, rest = ("jsonl" if text.endswith(".jsonl") else "sqlite"), text
    elif rest.startswith("//"):
        rest = rest[2:]
    if scheme == "memory":
        if rest:
            raise ConfigError(f"memory storage takes no path: {text!r}")
        return MemoryStorage()
    if not rest:
        raise ConfigError(f"storage URL {text!r} has no path (use {scheme}:PATH)")
    if scheme == "jsonl":
        return JsonlStorage(rest)
    return SqliteStorage(rest, synchronous=synchronous)
