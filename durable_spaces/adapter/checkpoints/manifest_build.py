"""A checkpoint's manifest from its listing (``workspace_tree.Listing``) and each file's
blob: ``build`` once, ``Builder`` for a caller that builds one workspace's manifest again
and again (``incremental.Taker``, one per Space instance)."""

from __future__ import annotations

from collections.abc import Callable, Set

from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.workspace_tree import TreeListing, TreeNode


def build(listing: TreeListing, sha: Callable[[str], str]) -> mf.Manifest:
    """The manifest of ``listing``; ``sha(path)`` gives a file's blob. Paths sharing an
    inode become hard links of the first of them (in manifest order)."""
    return Builder().build(listing, sha)


class Builder:
    """``build``, entry for entry, for a caller that builds one workspace's manifest
    again and again: the order of the paths is kept while the set of paths stays the
    same, and each path's entry while its node and blob do (building 1000 entries and
    sorting their paths was most of a checkpoint's manifest time). A caller that knows
    which paths may have changed since the last build (``changed``: a journal's) has
    only those built again, while the paths and the hard links stay the same. A memo of
    a pure function: what it returns never depends on what it kept."""

    def __init__(self) -> None:
        self._paths: frozenset[str] = frozenset()
        self._order: list[str] = []
        self._entries: dict[str, tuple[TreeNode, str | None, mf.ManifestEntry]] = {}
        self._out: mf.Manifest | None = None
        self._links = True  # the last build had hard links (or there was none)
        #: The paths whose entries the last build may have changed (None: any may).
        self.changed: Set[str] | None = None

    def build(
        self, listing: TreeListing, sha: Callable[[str], str], changed: Set[str] | None = None
    ) -> mf.Manifest:
        nodes = listing.nodes
        if (
            changed is not None
            and self._out is not None
            and not self._links
            and nodes.keys() == self._paths
            and not any(nodes[p].nlink > 1 and nodes[p].kind == mf.FILE for p in changed)
        ):
            out = dict(self._out)
            for p in changed:
                e = self._entry(p, nodes[p], sha)
                out[p] = e
            self._out, self.changed = out, changed
            return out
        self.changed = None  # hard links: an entry may change with another path's node
        if nodes.keys() != self._paths:
            self._paths, self._order = frozenset(nodes), mf.ordered(nodes)
        self._links = False
        known = self._entries
        self._entries = {}
        out = {}
        first: dict[int, str] = {}
        for path in self._order:
            n = nodes[path]
            if n.kind == mf.FILE and n.nlink > 1:
                self._links = True
                if n.ino in first:
                    out[path] = mf.ManifestEntry(mf.HARDLINK, 0, 0, first[n.ino], 0)
                    continue
                first[n.ino] = path
            out[path] = self._entry(path, n, sha, known)
        self._out = out
        return out

    def _entry(
        self,
        path: str,
        n: TreeNode,
        sha: Callable[[str], str],
        known: dict[str, tuple[TreeNode, str | None, mf.ManifestEntry]] | None = None,
    ) -> mf.ManifestEntry:
        ref: str | None = None
        if n.kind == mf.FILE:
            ref = sha(path)
        elif n.kind == mf.SYMLINK:
            ref = n.target
        k = (self._entries if known is None else known).get(path)
        if k is not None and k[1] == ref and k[0] == n:
            e = k[2]
        elif n.kind == mf.FILE:
            e = mf.ManifestEntry(mf.FILE, n.mode, n.size, ref, n.mtime_ns)
        elif n.kind == mf.SYMLINK:
            e = mf.ManifestEntry(mf.SYMLINK, 0o777, 0, ref, n.mtime_ns)
        else:
            e = mf.ManifestEntry(mf.DIR, n.mode, 0, None, n.mtime_ns)
        self._entries[path] = (n, ref, e)
        return e


#: The mutant ``checkpoint_misses_call``'s memory: per Space, the last manifest built and
#: how many were built (only while the mutant is on).
_misses: dict[str, tuple[mf.Manifest, int]] = {}


def mutant_misses_call(space: str, m: mf.Manifest, data: bytes) -> bytes:
    """The mutant ``checkpoint_misses_call`` (``chaos/mutants.py``): every other
    checkpoint this process takes of ``space`` holds the files that changed since the one
    before as that one held them (a new file left out), as a listing that trusted a stale
    look would; the builder's and the encoder's memos keep the truth, so the next
    checkpoint holds the change again. Returns the manifest's bytes to store."""
    prev, n = _misses.get(space, (None, 0))
    _misses[space] = (dict(m), n + 1)
    if prev is None or n % 2 == 0:
        return data
    stale = dict(m)
    linked = {e.ref for e in m.values() if e.kind == mf.HARDLINK}
    for p, e in m.items():
        old = prev.get(p)
        if e.kind != mf.FILE:
            continue
        if old is None and p not in linked:
            del stale[p]
        elif old is not None and old.kind == mf.FILE and old.ref != e.ref:
            stale[p] = old
    return mf.encode(stale)
