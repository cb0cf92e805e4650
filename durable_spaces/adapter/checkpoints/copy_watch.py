"""The names in the blobs directory of a Space's checkpoint copy (``.ds-checkpoints``),
kept by an inotify watch, so that a checkpoint's heal (``incremental``: put back blobs
an agent deleted) need not list and match ~1000 names on every call.

Soundness, point by point (the directory is listed again whenever one fails):

- **The watch comes before the listing**, on the very inode the checkpoint's batch
  opened (``/proc/self/fd``): a name changed after the listing is an event, one before
  it is in the listing, one in between is in both; the events, applied in order (a
  create or rename in adds the name, an unlink or rename out drops it), end where the
  directory is.
- **Every event is read before the names are used.** The kernel queues a directory's
  name-change event inside the syscall that makes it (create, link, unlink, rename), so
  every change made by a command the caller saw exit is queued before a checkpoint
  drains the queue (non-blocking, until empty).
- **The same directory:** the next batch must open the watched inode (device and
  inode), else a blobs directory replaced, renamed or mounted over is listed again; so
  is one whose watch ended (``IN_DELETE_SELF``, ``IN_MOVE_SELF``, ``IN_IGNORED``,
  ``IN_UNMOUNT``), and a queue overflow (``IN_Q_OVERFLOW``).
- **Only a local filesystem** with nothing mounted under the directory
  (``host.mounts``): a network or FUSE filesystem changes where this kernel raises no
  event. Anything else, or no inotify instance to be had (the per-user limit), is a
  listing every time, as before.
- **Few instances:** at most ``MAX_WATCHED`` per process (inotify instances are few per
  user, 128 by default, and the workspaces' change journals need theirs); past that a
  copy is listed every time.
- **Names only**, as the listing was: what a file at a blob's name holds is not watched;
  every restore checks each blob against its name anyway.
"""

from __future__ import annotations

import contextlib
import os
import threading

from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.host.inotify import INotify
from durable_spaces.host.inotify import flags as F
from durable_spaces.host.mounts import mount_problem

#: Copies one process watches at once (module doc); the others are listed every time.
MAX_WATCHED = 8
_live = 0
_live_lock = threading.Lock()
_MASK = (
    F.CREATE | F.DELETE | F.MOVED_FROM | F.MOVED_TO | F.DELETE_SELF | F.MOVE_SELF | F.ONLYDIR
)  # fmt: skip
_LOST = F.DELETE_SELF | F.MOVE_SELF | F.IGNORED | F.UNMOUNT | F.Q_OVERFLOW
_IN = F.CREATE | F.MOVED_TO
_OUT = F.DELETE | F.MOVED_FROM


class BlobNames:
    """The blob names of one copy's blobs directory (module doc). ``listed`` counts the
    listings, for tests."""

    def __init__(self) -> None:
        self._inotify: INotify | None = None
        self._key: tuple[int, int] | None = None  # (device, inode) of the watched dir
        self._names: set[str] = set()
        self._refused: tuple[int, int] | None = None  # a dir no watch can vouch for
        self.listed = 0

    def __deepcopy__(self, memo: dict[int, object]) -> BlobNames:
        return BlobNames()  # a watch is not copied: the copy lists the directory again

    def names(self, bfd: int) -> set[str]:
        """The blob names in the directory open at ``bfd`` (the caller's own set)."""
        st = os.fstat(bfd)
        key = (st.st_dev, st.st_ino)
        if self._inotify is not None and key == self._key and self._drain():
            return set(self._names)
        self.close()
        if key != self._refused:
            self._watch(bfd, key)
        self.listed += 1
        self._names = mf.blob_names(bfd)  # after the watch (module doc)
        return set(self._names)

    def _watch(self, bfd: int, key: tuple[int, int]) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{bfd}")
            with open("/proc/self/mountinfo", "rb") as f:
                why = mount_problem(f.read().decode(errors="replace"), path)
        except OSError:
            why = "no mount table"
        if why is not None:
            self._refused = key
            return
        global _live
        with _live_lock:
            if _live >= MAX_WATCHED:
                return
            _live += 1
        try:
            ino = INotify()
        except OSError:  # the per-user limit of instances: list every time
            self._release()
            return
        try:
            ino.add_watch(f"/proc/self/fd/{bfd}", _MASK)
        except OSError:
            ino.close()
            self._release()
            return
        self._inotify, self._key = ino, key

    @staticmethod
    def _release() -> None:
        global _live
        with _live_lock:
            _live -= 1

    def _drain(self) -> bool:
        """Apply every queued event; False when the names can no longer be vouched for."""
        assert self._inotify is not None
        try:
            while events := self._inotify.read(timeout=0):
                for ev in events:
                    if ev.mask & _LOST:
                        return False
                    if not mf.BLOB_NAME.fullmatch(ev.name):
                        continue
                    if ev.mask & _IN:
                        self._names.add(ev.name)
                    elif ev.mask & _OUT:
                        self._names.discard(ev.name)
        except OSError:
            return False
        return True

    def close(self) -> None:
        if self._inotify is not None:
            with contextlib.suppress(OSError):
                self._inotify.close()
            self._release()
        self._inotify, self._key = None, None

    def __del__(self) -> None:
        # A Seen dropped without ``forget``: its instance back to the pool (whatever
        # is left of the module at interpreter exit).
        with contextlib.suppress(Exception):
            self.close()
