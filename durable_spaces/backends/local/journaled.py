"""The scan of a host workspace kept by a change journal: a full scan once (which starts
the journal and watches everything it reads), then, for as long as the journal is
trusted, the last table with only the paths it names looked at again.

Why: a call's two scans (before it, for changes made outside the calls, and after it,
for its diff) each walked and stat-ed the whole workspace, and the first re-hashed the
previous call's files (too recent to trust by their timestamps). With the journal a
scan costs what changed since the last one: a sync, and the changed paths.

The result is the table a full scan would return (``local_fs.Scanner``): the same
entries, exclusions, ``unsupported`` names and depth limit; a changed file is always
hashed again (its event says it changed, whatever its timestamps say). Anything the
journal cannot vouch for (``journal.ChangeJournal``: overflow, limits, restarts, mounts,
new epoch) makes the next scan a full one, which starts a new journal.

``small`` is the same answer for a caller that would rather not hand a few lstats and
hashes to a worker thread (``spacesd``'s event loop): it answers only when what the
journal named is small, and otherwise keeps it for the next ``scan``.
"""

from __future__ import annotations

import os
import stat as st
import threading
from collections.abc import Callable, Sequence

from durable_spaces.backends.local import fs as local_fs
from durable_spaces.backends.local import journal as jr
from durable_spaces.errors import PathEscapeError
from durable_spaces.space import (
    MAX_SCAN_DEPTH,
    PathEntry,
    PathTable,
    confine,
    name_problem,
    unsupported,
)

#: Makes the journal of one scanner: (workspace root) -> a new ``ChangeJournal``.
JournalFactory = Callable[[str], jr.ChangeJournal]
#: ``small``: at most this many changed paths, each a file of at most ``SMALL_BYTES``
#: (or gone, or a link), is work a caller may do on its event loop rather than hand
#: to a worker thread (the hand-off cost more than the work: docs/performance.md).
SMALL_PATHS = 32
SMALL_BYTES = 256 * 1024


def small_if_free(
    lock: threading.Lock, scanner: JournaledScanner, path: str, exclude: Sequence[str]
) -> PathTable | None:
    """``scanner.small`` right here (no worker-thread hand-off, which costs more than a
    few lstats and hashes) unless a worker thread holds ``lock``, the scanner's; else
    None: the caller scans in a thread."""
    if not lock.acquire(blocking=False):
        return None
    try:
        return scanner.small(path, exclude)
    finally:
        lock.release()


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


class JournaledScanner:
    """A ``local_fs.Scanner`` plus a journal, for the workspace ``root``.

    ``stats`` adds to the scanner's counters ``full`` (full scans), ``journal`` (scans
    the journal answered) and ``relooked`` (paths those looked at); ``why_full`` is why
    the last full scan was needed.
    """

    def __init__(
        self,
        root: str,
        make_journal: JournalFactory | None,
        host_fallback: bool = True,
        stats: dict[str, int] | None = None,
        resolve_root: Callable[[], str] | None = None,
    ) -> None:
        self.root = root
        #: Finds ``root`` again before each full scan (a container's workspace, held by
        #: a descriptor whose directory may have been swapped since: ``docker.host_view``);
        #: what it raises (``OSError``) makes the scan the caller's.
        self._resolve = resolve_root
        #: Whether a scan without a journal walks this host (``LocalSpace``) or returns
        #: None for the caller to scan its own way (a daemon that may see other mounts).
        self.host_fallback = host_fallback
        self.scanner = local_fs.Scanner()
        if stats is not None:  # one set of counters with the caller's other scans
            stats.update({k: stats.get(k, v) for k, v in self.scanner.stats.items()})
            self.scanner.stats = stats
        self.stats = self.scanner.stats
        self.stats.update(full=0, journal=0, relooked=0)
        self.why_full = "no scan yet"
        self._make = make_journal
        self._journal: jr.ChangeJournal | None = None
        self._table: PathTable | None = None
        self._excl: list[str] = []
        #: What the journal named that ``small`` left for the next ``scan``.
        self._held = jr.Changes()

    @property
    def kept(self) -> dict[str, bytes]:
        """The bytes of the files the last scan hashed (``local_fs.Scanner.kept``)."""
        return self.scanner.kept

    def reset(self, why: str) -> None:
        """Trust nothing seen so far (a new epoch): the next scan is a full one."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        self._table = None
        self._held = jr.Changes()  # the full scan that follows looks at everything
        self.why_full = why

    def close(self) -> None:
        self.reset("closed")

    # --- scans ------------------------------------------------------------------------

    def scan(self, path: str = ".", exclude: Sequence[str] = ()) -> PathTable | None:
        """The table under ``path``; None when no journal can keep it and scans without
        one are not this host's (``host_fallback``)."""
        if self._make is None or confine(self.root, path) != ".":
            return self.scanner.scan(self.root, path, exclude) if self.host_fallback else None
        excl = [confine(self.root, e) for e in exclude]
        if "." in excl:
            return {}
        j = self._journal
        if j is not None and self._table is not None and excl == self._excl:
            changes = self._take(j)
            if changes is not None:
                return self._answer(changes, excl)
            self.why_full = j.broken or "the journal is not trusted"
        elif self._table is not None:
            self.why_full = "scanned with other exclusions"
        return self._full(exclude, excl)

    def small(self, path: str = ".", exclude: Sequence[str] = ()) -> PathTable | None:
        """``scan``'s answer when the journal is trusted and what it named is small
        (``SMALL_PATHS``); None otherwise, having kept what it named for ``scan``."""
        if self._make is None or confine(self.root, path) != ".":
            return None
        excl = [confine(self.root, e) for e in exclude]
        j = self._journal
        if j is None or self._table is None or excl != self._excl or "." in excl:
            return None
        changes = self._take(j)
        if changes is None:
            return None  # ``scan`` finds the journal broken and scans in full
        if not self._is_small(changes):
            self._held = changes
            return None
        return self._answer(changes, excl)

    def _take(self, j: jr.ChangeJournal) -> jr.Changes | None:
        """What the journal named since the last look, with what ``small`` left."""
        changes = j.changes()
        held, self._held = self._held, jr.Changes()
        if changes is None:
            return None
        changes.paths |= held.paths
        changes.trees |= held.trees
        return changes

    def _is_small(self, changes: jr.Changes) -> bool:
        if changes.trees or len(changes.paths) > SMALL_PATHS:
            return False
        for rel in changes.paths:
            try:  # only a guess at the work (a link on the way is the walk's to refuse)
                s = os.lstat(os.path.join(self.root, rel))
            except OSError:
                continue  # gone: a drop
            if st.S_ISDIR(s.st_mode) or (st.S_ISREG(s.st_mode) and s.st_size > SMALL_BYTES):
                return False
        return True

    def _answer(self, changes: jr.Changes, excl: list[str]) -> PathTable:
        assert self._table is not None
        self.stats["journal"] += 1
        self._apply(changes, excl)
        self.stats["scans"] += 1
        self.stats["files"] = len(self._table)
        return dict(self._table)

    def _full(self, exclude: Sequence[str], excl: list[str]) -> PathTable | None:
        """A full scan that (re)starts the journal: watches first, then reads."""
        self.reset(self.why_full)
        if self._resolve is not None:
            try:
                self.root = self._resolve()
            except OSError as e:
                self.why_full = f"the workspace cannot be found here: {e}"
                return None
        journal = self._make(self.root) if self._make is not None else None
        if journal is not None and journal.broken is not None:
            self.why_full = journal.broken  # e.g. not a local filesystem: stays off
            journal.close()
            journal = None
        if journal is None and not self.host_fallback:
            return None
        table = self.scanner.scan(self.root, ".", exclude, watch=journal)
        self.stats["full"] += 1
        if journal is not None and journal.broken is None:
            self._journal, self._table, self._excl = journal, dict(table), excl
        elif journal is not None:
            self.why_full = journal.broken or "the journal could not start"
            journal.close()
        return table

    # --- what the journal named ----------------------------------------------------------

    def _apply(self, changes: jr.Changes, excl: list[str]) -> None:
        start = self.scanner.begin()
        trees = sorted(changes.trees)
        top: list[str] = []
        for t in trees:  # a tree inside another is walked with it
            if not top or not _under(t, top[-1]):
                top.append(t)
        paths = sorted(p for p in changes.paths if not any(_under(p, t) for t in top))
        for t in top:
            self._relook(t, excl, start, tree=True)
        for p in paths:
            self._relook(p, excl, start, tree=False)
        self.stats["relooked"] += len(top) + len(paths)

    def _drop(self, rel: str, tree: bool) -> None:
        assert self._table is not None and self._journal is not None
        self._table.pop(rel, None)
        if tree:
            prefix = rel + "/"
            for k in [k for k in self._table if k.startswith(prefix)]:
                del self._table[k]
        self._journal.forget(rel, tree)

    def _relook(self, rel: str, excl: list[str], start: int, tree: bool) -> None:
        """Make the table's entries at ``rel`` (and below it, with ``tree``) what a full
        scan would find there now."""
        assert self._table is not None and self._journal is not None
        parts = rel.split("/")
        if any(_under(rel, x) for x in excl) or any(name_problem(p) for p in parts[:-1]):
            self._drop(rel, tree=True)  # nothing a full scan lists
            return
        try:
            with local_fs._dir(self.root, parts[:-1]) as dfd:
                self._relook_in(dfd, parts[-1], rel, excl, start, tree)
        except (FileNotFoundError, NotADirectoryError, PathEscapeError):
            self._drop(rel, tree=True)  # gone, or a parent is no longer a directory

    def _relook_in(
        self, dfd: int, name: str, rel: str, excl: list[str], start: int, tree: bool
    ) -> None:
        assert self._table is not None and self._journal is not None
        journal = self._journal
        try:
            s = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            self._drop(rel, tree=True)
            return
        was_dir = journal.known_dir(rel)
        why = name_problem(name)
        if why is not None:
            self._drop(rel, tree=True)
            self._table[rel] = unsupported(why)
            return
        if st.S_ISDIR(s.st_mode):
            fd = local_fs._open_dir(name, dfd)
            try:
                if not tree and was_dir and journal.is_watched_dir(rel, fd):
                    return  # the same directory, watched: its contents are its events'
                self._drop(rel, tree=True)
                if len(rel.split("/")) >= MAX_SCAN_DEPTH:
                    self._table[rel] = unsupported(f"deeper than {MAX_SCAN_DEPTH} levels")
                    return
                journal.dir(rel, fd)  # before the walk lists it
                self._table.update(self.scanner.subtree(fd, rel, excl, start, journal))
            finally:
                os.close(fd)
            return
        if tree or was_dir:
            self._drop(rel, tree=True)
        if st.S_ISREG(s.st_mode):
            journal.file(rel, dfd, name)  # before the read: later writes are events
            try:
                s = os.lstat(name, dir_fd=dfd)
                replaced = not st.S_ISREG(s.st_mode)
                if not replaced:
                    entry = self.scanner.file_entry(dfd, name, rel, s, start, cached=False)
                    self._table[rel] = entry
            except (FileNotFoundError, NotADirectoryError):
                replaced = True
            if replaced:
                # Replaced or removed after it was watched: an event of its directory,
                # looked at in the next round; a full scan would skip it too.
                self._drop(rel, tree=False)
        elif st.S_ISLNK(s.st_mode):
            self._journal.forget(rel, tree=False)
            self._table[rel] = PathEntry(
                kind="symlink", mode=0o777, target=os.readlink(name, dir_fd=dfd)
            )
        else:
            self._drop(rel, tree=False)  # fifos, sockets, devices: not in the image
