"""The change journal of a workspace that is a directory on this host (``local``, and
``spacesd``'s daemons on this host): inotify watches that name what changed since the
last scan, so a scan re-looks at those paths only (``journaled.py``).

Soundness, point by point (a full scan is the answer whenever one fails):

- **Every event is read before the journal is trusted.** The kernel queues an inotify
  event inside the syscall that causes it, in one FIFO per inotify instance. A sync
  touches a sentinel file watched by the same instance, waits for its event, then reads
  until the queue is empty: every change made by a syscall that returned before the
  sync (a command the caller saw exit, a file tool that returned) has been read. Changes
  racing the sync land either in this round or in the next one, never in neither, since
  a path is re-looked at only after its events were taken and its watch was in place.
- **Watches come before reads.** A directory is watched before it is listed, a file
  before it is stat-ed and hashed (``local_fs.Watch``): a change after the read is an
  event, a change before it is in what was read.
- **Files are watched one by one** (the inode, not only the name in its directory), so
  that a write through a hard link outside the workspace, or through a descriptor
  opened under a name that no longer exists, is still seen (``IN_MODIFY`` on the inode).
  Directories do not ask for ``IN_MODIFY``: the file's own watch reports it, and a file
  not yet watched was just created, which is an event of its directory.
- **Renames of directories** are events of both parents (``IN_MOVED_*`` with
  ``IN_ISDIR``): both paths are re-looked at recursively, which also moves the watches'
  names. A directory moved in from outside, or created, is walked.
- **Not trusted, full scan:** ``IN_Q_OVERFLOW``; the watch limit (``ENOSPC``) or
  ``MAX_WATCHES``; the workspace root deleted, moved, replaced or unmounted; a mount
  point appearing at or under the root in any mount namespace the caller names (a
  mount hides the watched directory; namespaces are polled, ``POLLPRI``, not re-read);
  a filesystem outside ``LOCAL_FILESYSTEMS`` (a network, FUSE or shared filesystem is
  changed where this kernel does not see it); a guard of the caller failing (the Space's
  machine restarted, ``LocalSpace``; its daemon started again, ``NamespacedSpace``); the
  sentinel's event not arriving; a new epoch (``reset``); a new process or Space object.
- **Stores through a shared writable ``mmap``** raise no event of their own; the last
  close of the file does (``IN_CLOSE_WRITE``: a mapping holds the file open, so that
  close comes after every store), which is before the scan after a command that
  exited. A process that outlives its call and keeps storing through a mapping is seen
  only at its last close; auto mode already leaves the image for checkpoints when a call
  leaves a process running in the workspace.

``Settings.space_journal`` off (``DS_SPACE_JOURNAL=0``) turns journals off (full scans every
time), to compare: the Spaces that make journals hold their settings.
The mutant ``journal_miss`` drops the events that say a file's contents changed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
from collections.abc import Callable, Sequence

from durable_spaces.chaos import mutants
from durable_spaces.host.inotify import INotify
from durable_spaces.host.inotify import flags as F
from durable_spaces.host.mounts import LOCAL_FILESYSTEMS as LOCAL_FILESYSTEMS  # re-exported
from durable_spaces.host.mounts import mount_problem
from durable_spaces.space_types import WorkspaceChanges

#: Watches one journal may hold (files + directories); a bigger tree is scanned in full.
MAX_WATCHES = 50_000
#: How long a sync waits for its sentinel's event (it is queued before ``utime``
#: returns, so this only bounds a broken instance).
SENTINEL_TIMEOUT_MS = 2000

_DIR_MASK = (
    F.CREATE | F.DELETE | F.MOVED_FROM | F.MOVED_TO | F.ATTRIB
    | F.DELETE_SELF | F.MOVE_SELF | F.ONLYDIR
)  # fmt: skip
_FILE_MASK = F.MODIFY | F.CLOSE_WRITE | F.ATTRIB | F.DELETE_SELF | F.DONT_FOLLOW
_ENTRIES = F.CREATE | F.DELETE | F.MOVED_FROM | F.MOVED_TO
_CONTENT = F.MODIFY | F.CLOSE_WRITE  # what the mutant ``journal_miss`` drops
SENTINEL = ".ds-journal-sentinel"


#: What to look at again (one definition, in the protocol's values).
Changes = WorkspaceChanges


def _join(base: str, name: str) -> str:
    return name if base == "." else f"{base}/{name}"


#: A mount table to watch: its ``/proc/<pid>/mountinfo`` path, or that path and the
#: workspace's path in that namespace when it is not the journal's root (a container's).
MountTable = str | tuple[str, str]


class _Mounts:
    """The mount tables of some namespaces, re-read only when the kernel says they
    changed (``POLLPRI`` on an open mountinfo); each checked for the workspace at its
    path in that namespace (``root`` where the table names none)."""

    def __init__(self, tables: Sequence[MountTable], root: str) -> None:
        self._files = []
        for t in tables:
            path, where = (t, root) if isinstance(t, str) else t
            self._files.append((open(path, "rb"), where))  # noqa: SIM115 (kept open to poll)
        self._poll = select.poll()
        for f, _ in self._files:
            self._poll.register(f.fileno(), select.POLLPRI | select.POLLERR)
        self.problem = self._check()
        self._poll.poll(0)  # the open itself may flag a change: consume it

    def _check(self) -> str | None:
        for f, where in self._files:
            f.seek(0)
            why = mount_problem(f.read().decode(errors="replace"), where)
            if why is not None:
                return why
        return None

    def now(self) -> str | None:
        if self.problem is None and self._poll.poll(0):
            self.problem = self._check()
        return self.problem

    def close(self) -> None:
        for f, _ in self._files:
            f.close()


class ChangeJournal:
    """inotify watches over the workspace ``root`` (a ``local_fs.Watch`` for its scans).

    ``guard`` says why the workspace may have changed without events (the machine
    restarted), or None; ``mountinfo`` names the mount tables whose namespaces change
    the workspace (commands') and read it (scans'). ``broken`` is why the journal is
    not trusted (any value: full scan and a new journal), None while it is.
    """

    def __init__(
        self,
        root: str,
        sentinel_dir: str,
        guard: Callable[[], str | None] | None = None,
        mountinfo: Sequence[MountTable] = ("/proc/self/mountinfo",),
    ) -> None:
        self.root = root
        self.broken: str | None = None
        self._guard = guard
        self._dirs: dict[int, str] = {}
        self._dir_wd: dict[str, int] = {}
        self._files: dict[int, set[str]] = {}
        self._file_wd: dict[str, int] = {}
        self._pending = Changes()
        self._ino: INotify | None = None
        self._mounts: _Mounts | None = None
        try:
            self._mounts = _Mounts(mountinfo, os.path.realpath(root))
            if self._mounts.problem is not None:
                self.broken = self._mounts.problem
                return
            st = os.stat(root)
            self._root_id = (st.st_dev, st.st_ino)
            os.makedirs(sentinel_dir, mode=0o700, exist_ok=True)
            self._sentinel = os.path.join(sentinel_dir, SENTINEL)
            with open(self._sentinel, "ab"):
                pass
            self._ino = INotify(nonblocking=True)
            self._sentinel_wd = self._ino.add_watch(self._sentinel, F.ATTRIB | F.DONT_FOLLOW)
        except OSError as e:
            self.broken = f"cannot start the journal: {e}"

    @property
    def watches(self) -> int:
        return len(self._dirs) + len(self._files)

    # --- watches (``local_fs.Watch``) -------------------------------------------------

    def _add(self, path: str, mask: int) -> int | None:
        if self._ino is None or self.broken is not None:
            return None
        if self.watches >= MAX_WATCHES:
            self.broken = f"more than {MAX_WATCHES} watches"
            return None
        try:
            return int(self._ino.add_watch(path, mask))
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return None  # gone already: its directory's event says so
            self.broken = (
                "the inotify watch limit was hit (fs.inotify.max_user_watches)"
                if e.errno == errno.ENOSPC
                else f"cannot watch {path!r}: {e}"
            )
            return None

    def dir(self, rel: str, fd: int) -> None:
        # The magic link /proc/self/fd/N is followed to the directory the scan opened
        # without following any symlink: the watch is on what the scan lists.
        wd = self._add(f"/proc/self/fd/{fd}", _DIR_MASK)
        if wd is None:
            return
        old = self._dir_wd.get(rel)
        if old is not None and old != wd:
            self._dirs.pop(old, None)
        prev = self._dirs.get(wd)
        if prev is not None and prev != rel and self._dir_wd.get(prev) == wd:
            del self._dir_wd[prev]
        self._dirs[wd] = rel
        self._dir_wd[rel] = wd

    def file(self, rel: str, dir_fd: int, name: str) -> None:
        wd = self._add(f"/proc/self/fd/{dir_fd}/{name}", _FILE_MASK)
        if wd is None:
            return
        old = self._file_wd.get(rel)
        if old is not None and old != wd:
            self._unlink_file(rel, old)
        self._files.setdefault(wd, set()).add(rel)
        self._file_wd[rel] = wd

    def is_watched_dir(self, rel: str, fd: int) -> bool:
        """Whether the directory open as ``fd`` is the one watched under ``rel``
        (asking again returns the watch it already has)."""
        wd = self._dir_wd.get(rel)
        if wd is None or self._ino is None:
            return False
        try:
            return int(self._ino.add_watch(f"/proc/self/fd/{fd}", _DIR_MASK)) == wd
        except OSError:
            return False

    def _unlink_file(self, rel: str, wd: int) -> None:
        rels = self._files.get(wd)
        if rels is None:
            return
        rels.discard(rel)
        if not rels:
            del self._files[wd]
            self._rm(wd)

    def _rm(self, wd: int) -> None:
        if self._ino is not None:
            with contextlib.suppress(OSError):
                self._ino.rm_watch(wd)

    def forget(self, rel: str, tree: bool) -> None:
        """``rel`` (and with ``tree`` all below it) left the table: drop their watches."""
        wd = self._file_wd.pop(rel, None)
        if wd is not None:
            self._unlink_file(rel, wd)
        if not tree:
            return
        prefix = rel + "/"
        for p in [p for p in self._file_wd if p.startswith(prefix)]:
            self._unlink_file(p, self._file_wd.pop(p))
        for p in [p for p in self._dir_wd if p == rel or p.startswith(prefix)]:
            dwd = self._dir_wd.pop(p)
            self._dirs.pop(dwd, None)
            self._rm(dwd)

    def known_dir(self, rel: str) -> bool:
        return rel in self._dir_wd

    # --- reading ----------------------------------------------------------------------

    def _event(self, wd: int, mask: int, name: str) -> bool:
        """Take one event into ``_pending``; True for the sentinel's."""
        if mask & F.Q_OVERFLOW:
            self.broken = "the inotify queue overflowed (events were lost)"
            return False
        if mask & F.UNMOUNT:
            self.broken = "a watched filesystem was unmounted"
            return False
        if wd == self._sentinel_wd:
            return True
        if mask & _CONTENT and mutants.active("journal_miss"):
            return False  # the defect: a change of contents goes unrecorded
        base = self._dirs.get(wd)
        if base is not None:
            if name:
                rel = _join(base, name)
                # A directory that appeared, went or moved is walked; one whose own
                # attributes changed is looked at alone (its contents have its watch).
                tree = mask & F.ISDIR and mask & _ENTRIES
                (self._pending.trees if tree else self._pending.paths).add(rel)
            elif mask & (F.DELETE_SELF | F.MOVE_SELF | F.IGNORED):
                if base == ".":
                    self.broken = "the workspace directory itself was moved or removed"
                    return False
                self._pending.trees.add(base)
            if mask & F.IGNORED:
                self._dirs.pop(wd, None)
                if self._dir_wd.get(base) == wd:
                    del self._dir_wd[base]
            return False
        rels = self._files.get(wd)
        if rels is not None:
            self._pending.paths.update(rels)
            if mask & F.IGNORED:
                del self._files[wd]
                for r in rels:
                    if self._file_wd.get(r) == wd:
                        del self._file_wd[r]
        return False  # an unknown wd: a watch already dropped

    def changes(self) -> Changes | None:
        """Everything that changed since the last call (after a sync: see the module
        docstring), or None when the journal cannot be trusted (then ``broken`` says why)."""
        if self.broken is not None or self._ino is None:
            return None
        why = self._mounts.now() if self._mounts is not None else None
        why = why or (self._guard() if self._guard is not None else None)
        if why is None:
            try:
                st = os.stat(self.root)
                if (st.st_dev, st.st_ino) != self._root_id:
                    why = "the workspace directory was replaced"
            except OSError as e:
                why = f"the workspace directory is gone: {e}"
        if why is not None:
            self.broken = why
            return None
        try:
            os.utime(self._sentinel)
            seen = False
            while True:
                events = self._ino.read(timeout=0 if seen else SENTINEL_TIMEOUT_MS)
                if not events:
                    if not seen:
                        self.broken = "the journal's sentinel event did not arrive"
                    break
                for ev in events:
                    seen = self._event(ev.wd, ev.mask, ev.name) or seen
                    if self.broken is not None:
                        return None
        except OSError as e:
            self.broken = f"reading the journal failed: {e}"
        if self.broken is not None:
            return None
        out, self._pending = self._pending, Changes()
        return out

    def close(self) -> None:
        if self._ino is not None:
            with contextlib.suppress(OSError):
                self._ino.close()
            self._ino = None
        if self._mounts is not None:
            self._mounts.close()
            self._mounts = None
        self.broken = self.broken or "closed"
