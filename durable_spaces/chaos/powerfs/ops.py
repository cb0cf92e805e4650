"""The FUSE operations: a passthrough to the live tree that records what is still volatile.

Every operation runs on the live tree with real system calls, so the semantics processes
see (rename over a file, ENOTEMPTY, hard links, O_APPEND positions the kernel computes)
are the kernel's own. Mutations also note in ``Volatile`` what they changed; fsync and
fdatasync of a file and fsync of a directory copy the matching piece into the ``Image``.
One lock serializes mutations with syncs and with a cut (which takes it and never gives it
back). Reads take no lock.

Binding: mfusepy (ctypes over libfuse3's high-level API). It needs only the runtime library
(Debian's ``libfuse3-3``), no compiler or headers in CI, and its path API with our own
file handles (real fds on the live tree) keeps this module a thin passthrough; pyfuse3 is
a Cython build against ``libfuse3-dev`` and its low-level inode API would mean keeping an
inode table here. Locks are left to the kernel: no ``lock``/``flock`` callback, so libfuse
does not offer FUSE_POSIX_LOCKS/FLOCK_LOCKS and fcntl and flock locks are local (correct
for one machine). No ``direct_io``: the page cache serves mmap (SQLite's -shm), and
without writeback caching every write() reaches the server before it returns.

Unlinked open files: high-level libfuse gives each name of a hard link its own node, and a
node whose name is gone answers a getattr (the kernel sends ``fstat`` without a file
handle) with ESTALE. So ``hard_remove`` is off: libfuse renames an open file it is told to
unlink (or to rename over) to ``.fuse_hidden...`` and unlinks that name at the last
release. Those renames never touch the live tree's directories: the file moves to a
private directory beside it (``<live>.hidden``), the old entry counts as removed, and the
hidden name resolves there, its link not counted in ``st_nlink``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mfusepy

from durable_spaces.chaos.powerfs.disk import Disk
from durable_spaces.chaos.powerfs.image import AREA, CycleError, Image
from durable_spaces.chaos.powerfs.trap import Trap
from durable_spaces.chaos.powerfs.volatile import Volatile

_STRIP = os.O_CREAT | os.O_EXCL | os.O_NOCTTY | os.O_APPEND | getattr(os, "O_DIRECT", 0)
_UTIME_NOW = (1 << 30) - 1
_UTIME_OMIT = (1 << 30) - 2
_AT_FDCWD = -100
# libfuse3 fuse_common.h: capabilities we refuse (see the module docstring)
_CAP_POSIX_LOCKS = 1 << 1
_CAP_FLOCK_LOCKS = 1 << 10
_CAP_WRITEBACK_CACHE = 1 << 16
_HIDDEN = ".fuse_hidden"  # libfuse's prefix for an open file's unlinked name
_libc = ctypes.CDLL(None, use_errno=True)
# Deliberately broken builds (tests/chaos/test_powerfs.py proves its checks catch them):
# "fsync_noop" makes file fsync/fdatasync do nothing, "dirsync_noop" directory fsync.
_MUTANTS = frozenset(filter(None, os.environ.get("POWERFS_MUTANTS", "").split(",")))


def _renameat2(old: str, new: str, flags: int) -> None:
    """rename(2) with RENAME_NOREPLACE/RENAME_EXCHANGE (os.rename has no flags)."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(old), _AT_FDCWD, os.fsencode(new), flags):
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@dataclass
class _Open:
    ino: int
    sync: int  # 0, or O_DSYNC (1), or O_SYNC (2): every write is synced


def _sync_level(flags: int) -> int:
    if flags & os.O_SYNC == os.O_SYNC:
        return 2
    return 1 if flags & os.O_DSYNC else 0


class PowerOps(mfusepy.Operations):
    """The operations of one boot of the mount.

    mfusepy registers every attribute named like a libfuse operation: no attribute here may
    be called ``lock``, ``flock``, ``flush``, ``access``, ... unless it implements it.
    """

    use_ns = True

    def __init__(
        self,
        live: str,
        image: Image,
        volatile: Volatile,
        on_ready: Callable[[], None],
        disk: Disk | None = None,
    ) -> None:
        self.live = os.path.abspath(live)
        self.image = image
        self.volatile = volatile
        self.disk = Disk() if disk is None else disk  # latency and stalls (disk.py)
        self.trap = Trap()  # crash points inside the writes (trap.py)
        self.on_ready = on_ready
        self.mutex = threading.RLock()
        self.files: dict[int, _Open] = {}
        self.dirs: dict[int, int] = {}  # dir fh -> live inode
        self.hidden_dir = self.live + ".hidden"
        self.hidden: dict[str, str] = {}  # libfuse's hidden name -> the file's private path
        self.hidden_links: dict[int, int] = {}  # live inode -> its hidden names
        self.counters = {
            "writes": 0,
            "fsyncs": 0,
            "fdatasyncs": 0,
            "dir_fsyncs": 0,
            "tree_syncs": 0,
        }

    # --- helpers ---------------------------------------------------------------------

    def _p(self, path: str) -> str:
        if path == "/":
            return self.live
        return self.hidden.get(path) or self.live + path

    @staticmethod
    def _is_hidden(path: str) -> bool:
        return os.path.basename(path).startswith(_HIDDEN)

    def _hide(self, old: str, new: str) -> None:
        """libfuse hides an open file: move it out of the live tree (its entry is gone)."""
        if old in self.hidden or os.path.isdir(self._p(old)):
            raise mfusepy.FuseOSError(errno.EBUSY)  # libfuse then refuses the unlink
        private = os.path.join(self.hidden_dir, str(len(self.hidden)) + "-" + os.path.basename(new))
        os.makedirs(self.hidden_dir, mode=0o700, exist_ok=True)
        os.rename(self._p(old), private)
        self._parent_changed(old)
        self.hidden[new] = private
        ino = os.lstat(private).st_ino
        self.hidden_links[ino] = self.hidden_links.get(ino, 0) + 1

    def _unhide(self, path: str) -> None:
        private = self.hidden.pop(path)
        ino = os.lstat(private).st_ino
        os.unlink(private)
        left = self.hidden_links.pop(ino, 1) - 1
        if left:
            self.hidden_links[ino] = left

    @staticmethod
    def _reserve(path: str) -> None:
        if path == "/" + AREA:
            raise mfusepy.FuseOSError(errno.EPERM)

    def _parent_changed(self, path: str) -> None:
        self.volatile.dir_changed(os.lstat(self._p(os.path.dirname(path))).st_ino)

    def _born(self, path: str) -> None:
        """A new live inode: any record under its number belonged to a dead inode."""
        ino = os.lstat(path).st_ino
        self.volatile.forget(ino)
        self.image.by_live.pop(ino, None)

    @staticmethod
    def _owner(path: str) -> None:
        """The caller owns what it creates (the server runs as root)."""
        uid, gid, _ = mfusepy.fuse_get_context()
        if os.geteuid() == 0 and (uid, gid) != (0, 0):
            if os.stat(os.path.dirname(path)).st_mode & stat.S_ISGID:
                gid = -1  # a set-group-id directory decides the group
            os.chown(path, uid, gid, follow_symlinks=False)

    def sync_data(self, ino: int, fd: int, *, meta: bool) -> None:
        """Make live inode ``ino`` (readable at ``fd``) durable; the caller holds mutex."""
        node = self.image.sync_file(
            self.image.by_live.get(ino), fd, self.volatile.get(ino), meta=meta
        )
        self.image.by_live[ino] = node
        self.volatile.synced_data(ino, with_meta=meta)

    def _at(self, kind: str, path: str) -> None:
        """Before a state operation, outside the mutex: trap.py counts it, may hold it."""
        self.trap.op(kind, path, mfusepy.fuse_get_context()[2])

    def _disk_wait(self, path: str) -> None:
        """Before a durability call, outside the mutex: the disk's latency and stalls."""
        self.disk.durability_call(mfusepy.fuse_get_context()[2], path)

    def _sync_file(self, fh: int, *, meta: bool) -> None:
        rfd = os.open(f"/proc/self/fd/{fh}", os.O_RDONLY)  # fh may be write-only
        try:
            self.sync_data(self.files[fh].ino, rfd, meta=meta)
        finally:
            os.close(rfd)
        self.counters["fsyncs" if meta else "fdatasyncs"] += 1

    # --- mount life ------------------------------------------------------------------

    def init_with_config(self, conn: Any, config: Any) -> None:
        if config is not None:
            config.use_ino = 1  # st_ino of the live tree: tar and find see hard links
            config.hard_remove = 0  # open files unlinked are hidden (module docstring)
        if conn is not None:
            conn.want &= ~(_CAP_WRITEBACK_CACHE | _CAP_POSIX_LOCKS | _CAP_FLOCK_LOCKS)
        self.on_ready()

    # --- reads -----------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        st = os.fstat(fh) if fh is not None else os.lstat(self._p(path))
        keys = (
            "st_mode",
            "st_ino",
            "st_nlink",
            "st_uid",
            "st_gid",
            "st_size",
            "st_blocks",
            "st_blksize",
            "st_rdev",
        )
        attrs = {k: getattr(st, k) for k in keys}
        attrs["st_nlink"] -= self.hidden_links.get(st.st_ino, 0)
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def readlink(self, path: str) -> str:
        return os.readlink(self._p(path))

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self.live)
        keys = (
            "f_bsize",
            "f_frsize",
            "f_blocks",
            "f_bfree",
            "f_bavail",
            "f_files",
            "f_ffree",
            "f_favail",
            "f_namemax",
        )
        return {k: getattr(sv, k) for k in keys}

    def opendir(self, path: str) -> int:
        fd = os.open(self._p(path), os.O_RDONLY | os.O_DIRECTORY)
        self.dirs[fd] = os.fstat(fd).st_ino
        return fd

    def readdir(self, path: str, fh: int) -> list[Any]:
        out: list[Any] = [".", ".."]
        with os.scandir(fh) as entries:
            for e in entries:
                if e.is_symlink():
                    mode = stat.S_IFLNK
                elif e.is_dir(follow_symlinks=False):
                    mode = stat.S_IFDIR
                elif e.is_file(follow_symlinks=False):
                    mode = stat.S_IFREG
                else:
                    mode = stat.S_IFMT(e.stat(follow_symlinks=False).st_mode)
                out.append((e.name, {"st_ino": e.inode(), "st_mode": mode}, 0))
        return out

    def releasedir(self, path: str, fh: int) -> int:
        self.dirs.pop(fh, None)
        os.close(fh)
        return 0

    # --- opening ---------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        if flags & os.O_TRUNC:
            self._at("write", path)
        with self.mutex:  # O_TRUNC changes data
            fd = os.open(self._p(path), flags & ~_STRIP)
            ino = os.fstat(fd).st_ino
            self.files[fd] = _Open(ino, _sync_level(flags))
            if flags & os.O_TRUNC:
                self.volatile.truncated(ino, 0)
        return fd

    def create(self, path: str, mode: int, flags: int) -> int:
        self._reserve(path)
        p = self._p(path)
        with self.mutex:
            try:
                fd = os.open(p, (flags & ~_STRIP) | os.O_CREAT | os.O_EXCL, stat.S_IMODE(mode))
            except FileExistsError:  # created meanwhile by another request
                if flags & os.O_EXCL:
                    raise
                return self.open(path, flags & ~os.O_CREAT)
            self._owner(p)
            self._born(p)
            self._parent_changed(path)
            self.files[fd] = _Open(os.fstat(fd).st_ino, _sync_level(flags))
        return fd

    def release(self, path: str, fh: int) -> int:
        self.files.pop(fh, None)
        os.close(fh)
        return 0

    # --- data ------------------------------------------------------------------------

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._at("write", path)
        with self.mutex:
            n = os.pwrite(fh, data, offset)
            o = self.files[fh]
            self.volatile.wrote(o.ino, offset, data if n == len(data) else data[:n])
            self.counters["writes"] += 1
        if o.sync:
            self._disk_wait(path)
            with self.mutex:
                self._sync_file(fh, meta=o.sync == 2)
        return n

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._at("write", path)
        with self.mutex:
            if fh is not None:
                os.ftruncate(fh, length)
                ino = self.files[fh].ino
            else:
                os.truncate(self._p(path), length)
                ino = os.lstat(self._p(path)).st_ino
            self.volatile.truncated(ino, length)
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        if mode:  # KEEP_SIZE, PUNCH_HOLE, ...: callers fall back to writing
            raise mfusepy.FuseOSError(errno.EOPNOTSUPP)
        self._at("write", path)
        with self.mutex:
            os.posix_fallocate(fh, offset, size)
            self.volatile.extended(self.files[fh].ino)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        if "fsync_noop" in _MUTANTS:
            return 0
        self._at("fsync", path)
        self._disk_wait(path)
        with self.mutex:
            self._sync_file(fh, meta=not datasync)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        if "dirsync_noop" in _MUTANTS:
            return 0
        self._at("fsync", path)
        self._disk_wait(path)
        with self.mutex:
            ino = self.dirs[fh]
            # a descriptor of our own: a readdir on fh shares its offset
            fd = os.open(f"/proc/self/fd/{fh}", os.O_RDONLY | os.O_DIRECTORY)
            try:
                try:
                    node = self.image.sync_dir(self.image.by_live.get(ino), fd, meta=not datasync)
                except CycleError:
                    for d in self.image.sync_tree(self.live):
                        self.volatile.synced_dir(d, with_meta=True)
                    self.counters["tree_syncs"] += 1
                    node = self.image.sync_dir(self.image.by_live.get(ino), fd, meta=not datasync)
            finally:
                os.close(fd)
            self.image.by_live[ino] = node
            self.volatile.synced_dir(ino, with_meta=not datasync)
            self.counters["dir_fsyncs"] += 1
        return 0

    # --- metadata --------------------------------------------------------------------

    def _meta(self, path: str, fh: int | None, call: Callable[[int | str], None]) -> int:
        with self.mutex:
            target: int | str = fh if fh is not None else self._p(path)
            call(target)
            st = os.fstat(fh) if fh is not None else os.lstat(self._p(path))
            self.volatile.meta(st.st_ino)
        return 0

    def chmod(self, path: str, mode: int, fh: int | None = None) -> int:
        return self._meta(path, fh, lambda t: os.chmod(t, stat.S_IMODE(mode)))

    def chown(self, path: str, uid: int, gid: int, fh: int | None = None) -> int:
        def apply(t: int | str) -> None:
            if isinstance(t, int):
                os.chown(t, uid, gid)
            else:
                os.chown(t, uid, gid, follow_symlinks=False)

        return self._meta(path, fh, apply)

    def utimens(
        self,
        path: str,
        times: tuple[tuple[int, int], tuple[int, int]] | None,
        fh: int | None = None,
    ) -> int:
        def apply(t: int | str) -> None:
            st = os.fstat(t) if isinstance(t, int) else os.lstat(t)
            now = time.time_ns()
            given = times or ((0, _UTIME_NOW), (0, _UTIME_NOW))
            old = (st.st_atime_ns, st.st_mtime_ns)
            a, m = (
                now if nsec == _UTIME_NOW else old[i] if nsec == _UTIME_OMIT else sec * 10**9 + nsec
                for i, (sec, nsec) in enumerate(given)
            )
            if isinstance(t, int):
                os.utime(t, ns=(a, m))
            else:
                os.utime(t, ns=(a, m), follow_symlinks=False)

        return self._meta(path, fh, apply)

    # --- directory entries -----------------------------------------------------------

    def _entry(self, path: str, make: Callable[[str], None]) -> int:
        """Create a directory entry with a new inode."""
        self._reserve(path)
        p = self._p(path)
        with self.mutex:
            make(p)
            self._owner(p)
            self._born(p)
            self._parent_changed(path)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        return self._entry(path, lambda p: os.mkdir(p, stat.S_IMODE(mode)))

    def mknod(self, path: str, mode: int, dev: int) -> int:
        return self._entry(path, lambda p: os.mknod(p, mode, dev))

    def symlink(self, path: str, target: str) -> int:
        return self._entry(path, lambda p: os.symlink(target, p))

    def link(self, path: str, existing: str) -> int:
        self._reserve(path)
        with self.mutex:
            os.link(self._p(existing), self._p(path), follow_symlinks=False)
            self._parent_changed(path)
            self.volatile.meta(os.lstat(self._p(path)).st_ino)  # its link count
        return 0

    def unlink(self, path: str) -> int:
        with self.mutex:
            if path in self.hidden:
                self._unhide(path)
                return 0
            os.unlink(self._p(path))
            self._parent_changed(path)
        return 0

    def rmdir(self, path: str) -> int:
        with self.mutex:
            os.rmdir(self._p(path))
            self._parent_changed(path)
        return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        self._reserve(new)
        if not self._is_hidden(new):
            self._at("rename", new)
        with self.mutex:
            if self._is_hidden(new) and not flags and new not in self.hidden:
                self._hide(old, new)
                return 0
            if flags:
                _renameat2(self._p(old), self._p(new), flags)
            else:
                os.rename(self._p(old), self._p(new))
            self._parent_changed(old)
            if os.path.dirname(old) != os.path.dirname(new):
                self._parent_changed(new)
        return 0
