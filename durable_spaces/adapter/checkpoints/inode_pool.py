"""Files made ahead of a checkpoint: anonymous inodes (``O_TMPFILE``) opened in the
background, given a name only when a batch takes them (``checkpoints.batch.Batch``).

Why: making a file means allocating an inode, and while the filesystem's journal is
committing (a log or ledger ``fsync`` just before a checkpoint: the harness's commit,
the daemon's exec ledger) that allocation waits for the commit's I/O, many times what
the link or rename that names the file costs (docs/performance.md). A checkpoint
makes one file per new blob and one for its manifest, in the store and in the Space's
copy, so on the spacesd backend those waits were most of its walk. The pool does the
allocations while the next command runs, and a batch only links what it takes.

What it changes: nothing a reader can see. A pooled file has no name until a batch
takes it and links it to a temporary name (``.tmp-...``, as a file made there directly
would have been), so every step after the link is the one it was: the write, the fsync
before the rename, the rename over a damaged file, the directory's fsync. A file still
in the pool was never linked anywhere, so a process killed with files in its pool
leaves nothing of them behind (the kernel frees an unnamed inode with its last
descriptor).

Where it cannot: a filesystem without ``O_TMPFILE`` (FUSE, NFS, old kernels), a target
on another mount than the file (``EXDEV``), no ``/proc`` to link through: the batch makes
its file by name, as before, and the pool stops trying on that device. A forked child
never takes its parent's pooled files (they would be the same open files).
A store made with ``make_ahead`` False (``Settings.inode_pool``: ``DS_INODE_POOL=0``) makes
no more files ahead, to compare.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import deque

from durable_spaces.host.holders import fd_limit, not_workspace

__all__ = ["POOL", "InodePool"]

#: Errors that say the filesystem or kernel cannot make anonymous files here.
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT, errno.EPERM}


class InodePool:
    """Anonymous files per device, topped up by a background thread (module doc)."""

    #: Files kept ready per device, and in all (each holds a descriptor; in all, also no
    #: more than a sixteenth of the process's descriptor limit).
    PER_DEVICE = 32
    TOTAL = 96

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[int, deque[int]] = {}
        self._want: dict[int, int] = {}
        self._where: dict[int, str] = {}  # a directory on the device to make them in
        self._filling: set[int] = set()  # devices due a fill, or being filled
        self._off: set[int] = set()  # devices where it cannot work
        #: One filler thread per process, started at the first top-up and woken by each
        #: (a thread started per top-up made the checkpoint's thread wait for it to run:
        #: ``Thread.start`` returns only once the new thread has the interpreter's lock,
        #: which the loop's thread wanted too).
        self._wake = threading.Condition(self._lock)
        self._filler: threading.Thread | None = None
        self._pid = os.getpid()
        self.total = min(self.TOTAL, fd_limit() // 16)
        self.made = 0  # files made ahead, for tests
        #: Linking and reading a pooled file both go through ``/proc/self/fd``.
        self.usable = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget_in_child)

    def take(self, dfd: int) -> int | None:
        """A pooled file on the filesystem of directory ``dfd`` (its descriptor, now the
        caller's), or None: make one by name."""
        if os.getpid() != self._pid or not self.usable:
            return None
        dev = os.fstat(dfd).st_dev
        with self._lock:
            ready = self._ready.get(dev)
            if not ready:
                return None
            return ready.popleft()

    def link(self, fd: int, dfd: int, name: str) -> bool:
        """Give the pooled file ``fd`` the name ``name`` in ``dfd``; False when it cannot
        be linked (then the pool is off for that device: the caller copies it)."""
        try:
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True)
            return True
        except OSError as e:  # a name taken (EEXIST) is the caller's to retry
            if e.errno in (errno.EXDEV, errno.ENOENT, errno.EPERM, errno.EACCES, errno.ELOOP):
                self.turn_off(os.fstat(dfd).st_dev)
                return False
            raise

    def turn_off(self, dev: int) -> None:
        with self._lock:
            self._off.add(dev)
            for fd in self._ready.pop(dev, ()):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def top_up(self, directory: str, dev: int, used: int) -> None:
        """After a batch that used ``used`` new files in ``directory`` (on ``dev``): make
        about as many again, in the background, for the next one."""
        if os.getpid() != self._pid or not self.usable:
            return
        with self._lock:
            if dev in self._off:
                return
            want = min(self.PER_DEVICE, max(4, used + used // 2, self._want.get(dev, 0)))
            self._want[dev] = want
            self._where[dev] = directory
            if dev in self._filling or len(self._ready.get(dev, ())) >= want:
                return
            self._filling.add(dev)
            start = self._filler is None
            if start:  # once per process; later top-ups only wake it
                self._filler = threading.Thread(
                    target=self._serve, name="ds-inode-pool", daemon=True
                )
            else:
                self._wake.notify()
        if start and self._filler is not None:
            self._filler.start()

    def _serve(self) -> None:
        """The filler thread: fills every device due a fill, then sleeps until woken. A
        daemon thread, so a process exits (or ``fast_exit`` ends it) without joining it."""
        while True:
            with self._lock:
                while not self._filling:
                    self._wake.wait()
                dev = next(iter(self._filling))  # stays in it while filled: no top-up again
            try:
                self._fill(dev)
            finally:
                with self._lock:
                    self._filling.discard(dev)

    def _fill(self, dev: int) -> None:
        while True:
            with self._lock:
                ready = self._ready.setdefault(dev, deque())
                total = sum(len(q) for q in self._ready.values())
                if dev in self._off or len(ready) >= self._want[dev] or total >= self.total:
                    return
                where = self._where[dev]
            fd = self._make(where, dev)
            if fd is None:
                return
            with self._lock:
                if dev in self._off:
                    os.close(fd)
                    return
                self._ready.setdefault(dev, deque()).append(fd)
                self.made += 1

    def _make(self, where: str, dev: int) -> int | None:
        flags = os.O_RDWR | os.O_TMPFILE | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(where, flags, 0o600)
        except OSError as e:
            if e.errno in _UNSUPPORTED or e.errno == errno.ENOTDIR:
                self.turn_off(dev)
            return None
        if os.fstat(fd).st_dev != dev:  # the directory moved to another filesystem
            os.close(fd)
            return None
        return fd

    def held(self) -> list[int]:
        """Every pooled file's descriptor (none is a file of a workspace)."""
        with self._lock:
            return [fd for q in self._ready.values() for fd in q]

    def ready(self, dev: int) -> int:
        """How many files are ready on ``dev`` (for tests and the bench)."""
        with self._lock:
            return len(self._ready.get(dev, ()))

    def _forget_in_child(self) -> None:
        # The child's copies of the pooled descriptors are the parent's open files.
        for q in self._ready.values():
            for fd in q:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._ready, self._filling = {}, set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._filler = None  # the parent's thread is not in the child
        self._pid = os.getpid()


POOL = InodePool()
not_workspace(POOL.held)  # the look at this process's descriptors skips them
