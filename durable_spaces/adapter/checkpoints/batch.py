"""One batch of writes into a checkpoint directory (``checkpoints.store``): new blobs
and a manifest, made durable together.

Every file is written to a temporary (made ahead where it can be, ``inode_pool``).
When the batch is synced and ends with a manifest, the manifest's file also carries the
bytes of its small new blobs (``checkpoints.carry``): the commit fsyncs the manifest's
file, renames it into place and fsyncs the directory, and only then renames those blobs
into ``blobs/``, unsynced (their carrier is their durable copy). Every other blob (a
large one, one past ``CARRY_MAX``, any in a batch without a manifest) is fsynced with
the manifest (``fsync_all``, at once), renamed into ``blobs/`` and that directory fsynced
*before* the manifest is renamed into place. Either way a manifest on disk never names a
blob that has no durable copy, and a blob file in ``blobs/`` always has one. Leaving the
batch by an exception writes nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from durable_spaces.adapter.checkpoints import carry
from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.errors import CheckpointCopyError

if TYPE_CHECKING:
    from durable_spaces.adapter.checkpoints.inode_pool import InodePool

__all__ = ["CLONE_MIN", "Batch", "fsync_all", "read_all", "write_all"]

logger = logging.getLogger(__name__)

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
#: Files at least this big are reflinked when the filesystem can (smaller ones copied).
CLONE_MIN = 64 * 1024
CHUNK = 1 << 20


class _Store(Protocol):
    """What a batch uses of its store (``checkpoints.store.DirectoryCheckpointStore``): a
    protocol, so this module does not import the store that imports it."""

    dir: Path
    in_space: bool
    owner: tuple[int, int] | None
    pool: InodePool
    make_ahead: bool

    def _open_dirs(self) -> tuple[int, int]: ...

    def _lock(self, dfd: int, how: int) -> int: ...

    def _generation(self, dfd: int) -> int: ...

    def _tmp(self, dfd: int) -> tuple[int, str]: ...

    def _install(self, sfd: int, tmp: str, dfd: int, name: str) -> None: ...

    def _retire(
        self, dfd: int, bfd: int, names: list[str], needed: set[str] | None = None
    ) -> None: ...


class Batch:
    """New blobs and a manifest for one directory, made durable together (module doc).
    Use as a context manager; leaving it by an exception writes nothing.

    Its commit has the store's pool make as many files ahead as it used, for the next
    batch (``inode_pool``). With ``refill_now`` False it leaves that to its caller,
    ``refill`` once the commit is over: a checkpoint on a call's path asks for it after
    the call's result (``incremental``), since a fill started at its commit (a file per
    blob, made while the journal still commits the batch's fsyncs) ran beside the
    checkpoint's hand-back and the result's commit, and slowed both (docs/performance.md,
    "Figures behind the code's choices")."""

    def __init__(
        self,
        store: _Store,
        shared_lock: bool,
        sync: bool,
        refill_now: bool = True,
    ) -> None:
        self.store = store
        self.sync = sync
        self._refill_now = refill_now
        #: The pool's top-up this batch's commit left to its caller (``refill_now``).
        self.refill: Callable[[], None] | None = None
        self._lock_fd: int | None = None
        self._dfd = -1
        self._bfd = -1
        self._pending: list[tuple[int, str, str]] = []  # (fd, tmp name, blob name)
        self._manifest: tuple[int, str, str] | None = None
        self._shared = shared_lock
        self.added: set[str] = set()
        self.generation = 0
        self._pooled = 0  # files taken from the pool (``inode_pool``)
        #: Small new blobs the manifest will carry (``checkpoints.carry``): a synced batch
        #: of a store of its own (a Space's copy is read by commands that know no carrier).
        self._carry_ok = sync and not store.in_space
        self._small: dict[str, bytes] = {}
        self._small_bytes = 0
        self._carried: frozenset[str] = frozenset()  # what the manifest's file carries

    def __enter__(self) -> Batch:
        self._dfd, self._bfd = self.store._open_dirs()
        if self._shared:
            self._lock_fd = self.store._lock(self._dfd, fcntl.LOCK_SH)
        self.generation = self.store._generation(self._dfd)
        return self

    def has(self, sha: str, size: int) -> bool:
        """Whether blob ``sha`` of ``size`` bytes is there (or added to this batch)."""
        if sha in self.added:
            return True
        try:
            st = os.lstat(sha, dir_fd=self._bfd)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == size

    @property
    def blobs_fd(self) -> int:
        """The open blobs directory (for a watch of its names, ``copy_watch``)."""
        return self._bfd

    def present(self) -> set[str]:
        """Every blob name in the directory (one listing)."""
        return mf.blob_names(self._bfd) | self.added

    def add(self, data: bytes, replace: bool = False) -> str:
        """Add a blob (if it is not there already, or ``replace``: over a damaged one);
        returns its sha256."""
        sha = hashlib.sha256(data).hexdigest()
        if sha in self.added or (not replace and self.has(sha, len(data))):
            return sha
        fd, tmp = self._new_file()
        self._pending.append((fd, tmp, sha))
        write_all(fd, data)
        self.added.add(sha)
        if (
            self._carry_ok
            and self._manifest is None
            and len(data) < CLONE_MIN
            and self._small_bytes + len(data) <= carry.CARRY_MAX
        ):
            self._small[sha] = data
            self._small_bytes += len(data)
        return sha

    def add_from(self, src: int, size: int) -> tuple[str, bytes | None]:
        """Add the bytes of the open regular file ``src`` (read from where it is);
        returns the sha256, and the bytes when they were read whole (small files):
        large ones are reflinked where the filesystem can and hashed from the clone."""
        if size < CLONE_MIN:
            data = read_all(src)
            return self.add(data), data
        fd, tmp = self._new_file()
        try:
            try:
                fcntl.ioctl(fd, _FICLONE, src)
                sha = _hash_fd(fd)
            except OSError:  # no reflinks here: copy while hashing
                os.lseek(src, 0, os.SEEK_SET)
                sha = _copy_hashing(src, fd)
        except BaseException:
            self._drop(fd, tmp)
            raise
        if sha in self.added or self.has(sha, os.fstat(fd).st_size):
            self._drop(fd, tmp)
        else:
            self._pending.append((fd, tmp, sha))
            self.added.add(sha)
        return sha, None

    def open_blob(self, sha: str) -> int:
        """A read descriptor of blob ``sha`` (added by this batch or already there)."""
        for _, tmp, name in self._pending:
            if name == sha:
                return os.open(tmp, os.O_RDONLY | NOFOLLOW, dir_fd=self._dfd)
        return os.open(sha, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK, dir_fd=self._bfd)

    def manifest(self, cid: CheckpointId, data: bytes) -> None:
        """The checkpoint this batch ends with (renamed into place after its blobs): a
        manifest, or (``put``) a tar."""
        if not cid.matches(data):
            raise CheckpointCopyError(f"refusing to store bytes that are not checkpoint {cid}")
        fd, tmp = self._new_file()
        self._manifest = (fd, tmp, f"{cid}{cid.suffix}")
        write_all(fd, data)
        if self._small:
            write_all(fd, carry.trailer(len(data), self._small.items()))
            self._carried = frozenset(self._small)
            self._small = {}

    def __exit__(self, typ: object, exc: object, tb: object) -> None:
        try:
            if typ is None:
                self._commit()
        finally:
            for fd, tmp, _ in [*self._pending, *([self._manifest] if self._manifest else [])]:
                with contextlib.suppress(OSError):
                    os.close(fd)
                if typ is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=self._dfd)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
            for fd in (self._bfd, self._dfd):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _new_file(self) -> tuple[int, str]:
        """A file to write, by its temporary name: one made ahead (``inode_pool``) and
        linked to it now, else (none ready, or it cannot be linked here) one made now by
        name. Either way, every later step (fsync, rename, directory fsync) is the same."""
        fd = self.store.pool.take(self._dfd)
        if fd is not None:
            self._pooled += 1
            try:
                for _ in range(5):
                    name = f".tmp-{os.urandom(8).hex()}"
                    with contextlib.suppress(FileExistsError):
                        if self.store.pool.link(fd, self._dfd, name):
                            if self.store.owner is not None:
                                os.fchown(fd, *self.store.owner)
                            return fd, name
                        break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # still empty and unnamed: nothing of it remains
        return self.store._tmp(self._dfd)

    def _drop(self, fd: int, tmp: str) -> None:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=self._dfd)

    def _commit(self) -> None:
        files = [*self._pending, *([self._manifest] if self._manifest else [])]
        own = [p for p in self._pending if p[2] not in self._carried]
        if self.sync:
            fsync_all([fd for fd, _, _ in own] + ([self._manifest[0]] if self._manifest else []))
        for _, tmp, name in own:
            self.store._install(self._dfd, tmp, self._bfd, name)
        if own and self.sync:
            os.fsync(self._bfd)
        if self._manifest is not None:
            _, tmp, name = self._manifest
            if self._carry_ok:  # a carrier it replaces gives up nothing it carries
                self.store._retire(self._dfd, self._bfd, [name])
            self.store._install(self._dfd, tmp, self._dfd, name)
        if self.sync:
            os.fsync(self._dfd)
        # The carried blobs' own files, now that their carrier is durable (a file in
        # ``blobs/`` a later batch finds, and does not carry again, always has one).
        for _, tmp, name in self._pending:
            if name in self._carried:
                try:
                    self.store._install(self._dfd, tmp, self._bfd, name)
                except OSError as e:  # still carried: readers find it there
                    logger.warning("blob %s stays only in its carrier: %s", name, e)
        # For the next batch here: as many files made ahead as this one made.
        refill = functools.partial(
            self.store.pool.top_up,
            os.fspath(self.store.dir),
            os.fstat(self._dfd).st_dev,
            len(files),
        )
        if not self.store.make_ahead:  # ``Settings.inode_pool`` off: none made ahead
            return
        if self._refill_now:
            refill()
        else:
            self.refill = refill


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def fsync_all(fds: list[int]) -> None:
    """fsync every file, all at once: the filesystem's journal then commits them
    together, where in turn each waits for a commit of its own. Not each as soon as it
    is written: those commits then stalled the batch's next files (docs/performance.md
    has both figures)."""
    global _pool
    if len(fds) < 2:
        for fd in fds:
            os.fsync(fd)
        return
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="ds-fsync")
            # Its idle workers ended at exit, so a lab process's exit_now can skip the
            # teardown (campaigns/fast_exit.py).
            atexit.register(_pool.shutdown)
    for f in [_pool.submit(os.fsync, fd) for fd in fds]:
        f.result()


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_all(fd: int) -> bytes:
    """The rest of the open file ``fd``."""
    chunks = []
    while chunk := os.read(fd, CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


def _hash_fd(fd: int) -> str:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _copy_hashing(src: int, dst: int) -> str:
    h = hashlib.sha256()
    while chunk := os.read(src, CHUNK):
        h.update(chunk)
        write_all(dst, chunk)
    return h.hexdigest()
