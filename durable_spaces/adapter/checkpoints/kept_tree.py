"""A host workspace's listing kept between checkpoints by a change journal: the first
checkpoint walks everything with the journal watching (``workspace_tree.walk_host``),
each later one looks again only at what the journal names, at the files some process
holds (``host.holders``: stores through a shared mapping raise no event), at the root
and at the directories of what changed (the manifest keeps directories' times).

Why: the walk was most of a checkpoint's cost in a workspace where little changed (an
``lstat`` of every path, growing with the workspace: docs/performance.md). What it gives
up: nothing, where the journal vouches (``space.WorkspaceJournal``); everything it does
not vouch for (overflow, limits, a restarted machine, mounts, a process that turned
blind to ``/proc``) makes the next checkpoint a full walk with a new journal. A file
named by an event, or held by a process, is always read again, whatever its stat key
says; so, unlike a stat key, the journal also vouches for a file rewritten within the
clock tick of its last read (``workspace_tree.RACY_NS``), since it was watched before it
was read.

``DS_SPACE_JOURNAL=0`` turns it off (``backends/local/journal.py``), to compare.
"""

from __future__ import annotations

import os
import stat

from durable_spaces.adapter.checkpoints.manifest import DIR, FILE, ROOT
from durable_spaces.adapter.checkpoints.workspace_tree import (
    DIR_FLAGS,
    Take,
    TreeChanged,
    TreeListing,
    TreeNode,
    dir_node,
    host_dir,
    link_node,
    take_file,
    walk_stack,
)
from durable_spaces.host.holders import Holders
from durable_spaces.space import WorkspaceChanges, WorkspaceJournal


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def _parent(rel: str) -> str:
    head, sep, _ = rel.rpartition("/")
    return head if sep else ROOT


class KeptTree:
    """One workspace's journal, what its last listing found, and who held what."""

    def __init__(self, journal: WorkspaceJournal, holders: Holders, epoch: int) -> None:
        self.journal = journal
        self.epoch = epoch  # what it saw is trusted under this epoch only
        self.holders = holders
        #: The last listing, set by the caller once the checkpoint that made it is
        #: written (None meanwhile: a listing that lost the events it took is no base).
        self.listing: TreeListing | None = None
        #: The paths the last ``relook`` looked at again.
        self.touched: set[str] = set()
        self._walked: list[str] = []  # directories a ``relook`` walks whole
        self.broken: str | None = journal.broken or holders.problem

    def held(self) -> set[int] | None:
        """Inodes some process holds now (None: cannot tell, then nothing is trusted)."""
        held = self.holders.now()
        if held is None:
            self.broken = "a process that holds files cannot be looked at"
        return held

    def changes(self) -> WorkspaceChanges | None:
        if self.broken is not None:
            return None
        changes = self.journal.changes()
        if changes is None:
            self.broken = self.journal.broken or "the journal is not trusted"
        return changes

    def close(self) -> None:
        self.journal.close()
        self.broken = self.broken or "closed"

    def relook(
        self,
        root: str,
        last: TreeListing,
        clock_ns: int,
        changes: WorkspaceChanges,
        held: set[int],
        take: Take,
    ) -> TreeListing:
        """The listing a full walk would give now, from the ``last`` one and ``changes``
        (taken after ``clock_ns``); every file it looks at again is read (``take``), and
        so is every file whose inode is in ``held``."""
        prev = last.nodes
        listing = TreeListing(clock_ns, dict(prev))
        self._walked = []
        trees: list[str] = []
        for t in sorted(changes.trees):  # a tree inside another is walked with it
            if not trees or not _under(t, trees[-1]):
                trees.append(t)
        named = set(changes.paths)
        named.update(p for p, n in prev.items() if n.kind == FILE and n.ino in held)
        paths = sorted(p for p in named if not any(_under(p, t) for t in trees))
        dirs = {ROOT} | {_parent(p) for p in [*trees, *paths]}
        for t in trees:
            self._relook(root, listing.nodes, t, True, take)
        for p in paths:
            self._relook(root, listing.nodes, p, False, take)
        for d in sorted(dirs - {p for p in paths if p in listing.nodes}):
            if listing.nodes.get(d, TreeNode(FILE, 0)).kind == DIR:
                self._restat_dir(root, listing.nodes, d)
        # What a manifest built from ``last`` must build again: where the paths stayed
        # the same (a tree walked again, a path gone or new, changes the set).
        touched = {p for p in (*trees, *paths, *dirs) if p in listing.nodes}
        for top in self._walked:  # and everything below a directory walked again
            prefix = top + "/"
            touched.update(k for k in listing.nodes if k.startswith(prefix))
        self.touched, self._walked = touched, []
        return listing

    # --- one path ------------------------------------------------------------------------

    def _drop(self, nodes: dict[str, TreeNode], rel: str) -> None:
        was = nodes.pop(rel, None)
        tree = was is not None and was.kind == DIR  # only a directory has entries below
        if tree:
            prefix = rel + "/"
            for k in [k for k in nodes if k.startswith(prefix)]:
                del nodes[k]
        self.journal.forget(rel, tree=tree)

    def _relook(
        self, root: str, nodes: dict[str, TreeNode], rel: str, tree: bool, take: Take
    ) -> None:
        """Make ``nodes`` at ``rel`` (and below it, with ``tree``) what a walk finds now."""
        if rel == ROOT:
            raise TreeChanged("the workspace root itself was named")  # a full walk
        parts = rel.split("/")
        try:
            with host_dir(root, parts[:-1]) as dfd:
                self._relook_in(nodes, dfd, parts[-1], rel, tree, take)
        except FileNotFoundError:
            self._drop(nodes, rel)  # a parent is gone: its own event drops the rest

    def _relook_in(
        self, nodes: dict[str, TreeNode], dfd: int, name: str, rel: str, tree: bool, take: Take
    ) -> None:
        try:
            s = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            self._drop(nodes, rel)
            return
        was = nodes.get(rel)
        if stat.S_ISDIR(s.st_mode):
            try:
                fd = os.open(name, DIR_FLAGS, dir_fd=dfd)
            except OSError as e:
                raise TreeChanged(f"{rel!r}: {e.strerror}") from None
            keep = not tree and was is not None and was.kind == DIR
            if keep and self.journal.is_watched_dir(rel, fd):
                try:  # the same directory, watched: its entries are its events'
                    nodes[rel] = dir_node(os.fstat(fd))
                finally:
                    os.close(fd)
                return
            self._drop(nodes, rel)
            try:
                self.journal.dir(rel, fd)  # before it is listed
                nodes[rel] = dir_node(os.fstat(fd))
            except BaseException:
                os.close(fd)
                raise
            self._walked.append(rel)
            walk_stack([(rel + "/", fd)], nodes, _always, take, self.journal)
            return
        if was is not None and (was.kind == DIR or tree):
            self._drop(nodes, rel)
        if stat.S_ISREG(s.st_mode):
            self.journal.file(rel, dfd, name)  # before the read: later writes are events
            nodes[rel] = take_file(rel, name, dfd, take)  # swapped meanwhile: TreeChanged
        elif stat.S_ISLNK(s.st_mode):
            self.journal.forget(rel, tree=False)
            try:
                target = os.readlink(name, dir_fd=dfd)
            except OSError as e:  # replaced since its lstat: not "gone" (that is _relook's)
                raise TreeChanged(f"{rel!r}: {e.strerror}") from None
            nodes[rel] = link_node(s, target)
        else:
            self._drop(nodes, rel)  # FIFOs, sockets, devices: never in a checkpoint

    def _restat_dir(self, root: str, nodes: dict[str, TreeNode], rel: str) -> None:
        parts = [] if rel == ROOT else rel.split("/")
        try:
            with host_dir(root, parts) as fd:
                nodes[rel] = dir_node(os.fstat(fd))
        except FileNotFoundError:
            self._drop(nodes, rel)


def _always(path: str, node: TreeNode) -> bool:
    return True
