"""The JSONL log: one line per commit, one ``write`` and ``fsync`` each, and the
best-effort epoch fence of marker files (``FencedFileSystem``).

The log's identity (``Storage.identity``) is its first line, ``{"log": "<32 hex>"}``,
written and synced (with its directory) by whoever finds the file empty, before any
commit and under the file's lock: every commit after it may be lost unsynced
(``fsync=False``) and the identity stays. A log written before identities (its first
line a commit) takes one derived from its first line and its path: it never changes
while that line stays, and two such logs do not share it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from durable_spaces.chaos import failpoints
from durable_spaces.errors import (
    BadFileError,
    CorruptLogError,
    FenceHaltedError,
    LogError,
    StaleEpochError,
    TornTailWarning,
)
from durable_spaces.harness.log_core import (
    Commit,
    Fence,
    LogOp,
    check_epoch,
    check_identity,
    derived_identity,
    dumps_ops,
    new_identity,
)
from durable_spaces.harness.log_files import (
    FILE_MODE,
    OwnerLock,
    fsync_dir,
    open_file,
    private_dir,
    tighten,
)
from durable_spaces.host.bounded import parse_json

#: The longest JSONL line (one commit) a log writes or reads.
MAX_LINE_BYTES = 64 << 20
#: The most the identity's line may take (``{"log": "<32 hex>"}`` and some room).
_HEADER_MAX = 256


def _create_private(path: Path) -> bool:
    """Create ``path`` with mode 0600 if missing (never through a symlink); return whether
    it was created."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        return False
    os.close(fd)
    fsync_dir(path.parent)
    return True


class JsonlStorage:
    """An append-only JSON-lines log: ``{"seq":..,"epoch":..,"ops":[..]}`` per line, one
    ``write`` and ``fsync`` per commit (``fsync=False``: the write alone, so a commit
    survives a crash of the process but not of the host: docs/lab.md, "Power loss").

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
        fsync: bool = True,
    ) -> None:
        self.path = Path(path)
        self.fence = fence
        self._fsync = fsync
        self.torn_tail: str | None = None
        self._mutex = threading.Lock()
        self._commits: list[Commit] = []
        self._size = 0  # bytes of whole, parsed lines
        self._header = 0  # lines before the first commit: 1 with an identity line
        self.identity = ""
        # the log itself first: a symlink, directory or FIFO there gets no .lock beside it
        fd, _ = open_file(self.path, os.O_RDWR | os.O_APPEND, what="log", create=True)
        self._fd: int | None = fd
        try:
            self._owner = OwnerLock(self.path, exclusive=exclusive)
        except BaseException:
            os.close(fd)
            raise
        try:
            with self._flocked(fcntl.LOCK_EX):
                self._identity_locked()
            with self._flocked(fcntl.LOCK_SH):
                self._catch_up_locked(repair=False)
            tighten(fd, self.path, "log")  # only now: it reads as a log
        except BaseException:
            os.close(fd)
            self._owner.release()
            raise

    def _identity_locked(self) -> None:
        """Read the log's identity, or make it: the first line of an empty file (or of
        one holding only a torn line: nothing whole was ever written). Caller holds the
        file's flock exclusively."""
        fd = self._file
        size = os.fstat(fd).st_size
        head = os.pread(fd, min(size, MAX_LINE_BYTES + 1), 0)
        nl = head.find(b"\n")
        if nl < 0 and size <= MAX_LINE_BYTES:
            head = json.dumps({"log": new_identity()}).encode() + b"\n"
            os.ftruncate(fd, 0)
            os.pwrite(fd, head, 0)
            os.fsync(fd)
            fsync_dir(self.path.parent)
            nl = len(head) - 1
        first = head[:nl] if nl >= 0 else b""
        obj = None
        if first.startswith(b'{"log"') and len(first) <= _HEADER_MAX:
            with contextlib.suppress(BadFileError):
                obj = parse_json(first, where=str(self.path))
        if isinstance(obj, dict) and set(obj) == {"log"}:
            self.identity = check_identity(obj["log"], f"{self.path}: line 1")
            self._header, self._size = 1, nl + 1
            return
        # Written before identities: its first line is a commit (judged when read).
        self.identity = derived_identity(os.path.realpath(self.path).encode(), first)

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
            torn, self.torn_tail = self.torn_tail, self._read(fd, size)
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

    def _read(self, fd: int, size: int) -> str | None:
        """Append the commits in bytes ``_size..size``, a chunk at a time (a line longer
        than ``MAX_LINE_BYTES`` is refused, never read whole); return the torn tail."""
        pos, buf = self._size, bytearray()
        while pos < size:
            chunk = os.pread(fd, min(1 << 20, size - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            buf += chunk
            start = 0
            while (nl := buf.find(b"\n", start)) >= 0:
                raw = bytes(buf[start:nl])
                start = nl + 1
                lineno = len(self._commits) + 1 + self._header
                self._too_long(len(raw), lineno)
                last = start == len(buf) and pos >= size
                try:
                    obj = parse_json(raw, where=f"line {lineno}", max_depth=None)
                except ValueError as e:  # too deep for the parser, too
                    if last:
                        return f"line {lineno}: unparsable ({e})"
                    raise CorruptLogError(
                        f"{self.path}: line {lineno} is not valid JSON ({e}); the log is "
                        "damaged before its last line"
                    ) from e
                self._commits.append(self._commit(obj, lineno))
                self._size += len(raw) + 1
            del buf[:start]
            self._too_long(len(buf), len(self._commits) + 1 + self._header)
        if buf:
            lineno = len(self._commits) + 1 + self._header
            return f"line {lineno}: {len(buf)} bytes without a newline"
        return None

    def _too_long(self, n: int, lineno: int) -> None:
        if n > MAX_LINE_BYTES:
            raise CorruptLogError(
                f"{self.path}: line {lineno} is longer than {MAX_LINE_BYTES} bytes, more "
                "than any commit this log writes; the file is damaged or not a log"
            )

    def _commit(self, obj: Any, lineno: int) -> Commit:
        if not isinstance(obj, dict):
            raise CorruptLogError(f"{self.path}: line {lineno} is not a commit record")
        seq, epoch, ops = obj.get("seq"), obj.get("epoch"), obj.get("ops")
        why = None
        if type(seq) is not int:
            why = f"seq is {type(seq).__name__} {seq!r}, not an integer"
        elif epoch is not None and type(epoch) is not int:
            why = f"epoch is {type(epoch).__name__} {epoch!r}, not an integer or null"
        elif not isinstance(ops, list):
            why = f"ops is {type(ops).__name__}, not a list"
        elif not all(isinstance(o, dict) for o in ops):
            why = "ops holds an element that is not a JSON object"
        if why is not None:
            raise CorruptLogError(f"{self.path}: line {lineno} is not a commit record ({why})")
        if seq != lineno - self._header:
            raise CorruptLogError(f"{self.path}: line {lineno} holds seq {seq}")
        assert isinstance(ops, list)
        return Commit(seq, ops, epoch)

    def load(self) -> list[Commit]:
        """Every commit, in order (kept in memory: treat the returned ops as read-only)."""
        with self._mutex, self._flocked(fcntl.LOCK_SH):
            self._catch_up_locked(repair=False)
            return list(self._commits)

    def append(self, ops: Sequence[LogOp]) -> int:
        text = dumps_ops(ops)
        if len(text) > MAX_LINE_BYTES:  # characters <= bytes: surely over (exact check below)
            self._over_limit(len(text))
        stored = parse_json(text, where="ops", max_depth=None)  # what a reopen will read
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
            if len(line) - 1 > MAX_LINE_BYTES:
                self._over_limit(len(line))
            failpoints.hit("log.before_commit")
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                    if view:  # a short write (disk full, file size limit): a line half out
                        failpoints.hit("log.short_write")
                if self._fsync:
                    os.fsync(fd)
            except BaseException:
                os.ftruncate(fd, self._size)  # a failed write (ENOSPC) leaves no torn line
                raise
            self._commits.append(Commit(seq, stored, epoch))
            self._size += len(line)
            self.torn_tail = None
        failpoints.hit("log.after_commit")
        return seq

    def _over_limit(self, size: int) -> None:
        raise LogError(
            f"{self.path}: a commit of {size} bytes is over the log's limit of "
            f"{MAX_LINE_BYTES}; nothing was stored"
        )

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


_MARKER = re.compile(r"epoch-([0-9]+)", re.ASCII)


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
        self.epoch = check_epoch(epoch)
        self.directory = Path(directory)
        private_dir(self.directory, "log fence directory")
        self._halted: str | None = None

    def floor(self) -> int:
        try:
            names = os.listdir(self.directory)
        except OSError as e:
            raise LogError(f"log fence directory {self.directory}: {e.strerror or e}") from None
        epochs = [int(m[1]) for p in names if (m := _MARKER.fullmatch(p))]
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
    fsync: bool = True,
) -> tuple[JsonlStorage, FencedFileSystem]:
    """Open a JSONL log fenced at ``epoch`` by marker files in ``fence_dir`` (default
    ``<path>.fence/``). Best effort: see ``FencedFileSystem`` for the window."""
    fence = FencedFileSystem(fence_dir if fence_dir is not None else f"{path}.fence", epoch)
    return JsonlStorage(path, fence=fence, exclusive=False, fsync=fsync), fence
