"""The durable image: what survives a power cut, kept as a real directory tree.

The backing directory *is* the durable image at every moment: a durability call copies
the piece it makes durable from the live tree (the volatile state processes see) into it,
and nothing else ever touches it. So a cut, or the death of the FUSE server, leaves the
backing directory exactly as a power loss would.

An inode is made durable piecewise, as POSIX says: its data by fsync of the file, a
directory's entries by fsync of that directory. The two can happen in either order, so an
inode may be durable with no durable name yet (a file fsynced before its directory); such
an *orphan* waits in ``<backing>/.powerfs/<id>`` until a directory fsync names it, and is
deleted at the next boot, as fsck would reclaim it. ``Node`` is the image's in-memory
index: which inode sits under which names, so a directory fsync can link, move or orphan
entries without searching the disk.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from durable_spaces.chaos.powerfs.volatile import Pending

AREA = ".powerfs"  # reserved name in the backing root: orphans of this boot
_CHUNK = 1 << 20
Kind = Literal["dir", "file", "symlink", "special"]


def kind_of(mode: int) -> Kind:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "special"


@dataclass(eq=False)
class ImageNode:
    """One durable inode: its kind, its durable names, and (a directory) its entries."""

    id: int
    kind: Kind
    names: set[tuple[ImageNode, str]] = field(default_factory=set)
    children: dict[str, ImageNode] = field(default_factory=dict)


class CycleError(Exception):
    """Applying one directory's entries would put a directory inside itself in the image
    (nested directories moved around each other); the caller syncs the whole tree."""


class Image:
    """The backing directory and its index; ``by_live`` maps live inode numbers to nodes."""

    def __init__(self, backing: str) -> None:
        self.root = os.path.abspath(backing)
        self.area = os.path.join(self.root, AREA)
        self.top = ImageNode(0, "dir")
        self.by_live: dict[int, ImageNode] = {}
        self._next_id = 1

    # --- the index -------------------------------------------------------------------

    def scan(self, live: str) -> None:
        """Index the backing tree; ``live`` is a fresh copy of it (same relative paths)."""
        self.by_live = {os.lstat(live).st_ino: self.top}
        hard: dict[int, ImageNode] = {}  # backing st_ino of non-directories: hard links
        stack: list[tuple[ImageNode, str]] = [(self.top, "")]
        while stack:
            parent, rel = stack.pop()
            with os.scandir(os.path.join(self.root, rel)) as entries:
                for e in entries:
                    if not rel and e.name == AREA:
                        continue
                    st = e.stat(follow_symlinks=False)
                    kind = kind_of(st.st_mode)
                    node = hard.get(st.st_ino) if kind != "dir" else None
                    if node is None:
                        node = self._new(kind)
                        if kind != "dir":
                            hard[st.st_ino] = node
                    self._attach(parent, e.name, node)
                    sub = os.path.join(rel, e.name)
                    self.by_live[os.lstat(os.path.join(live, sub)).st_ino] = node
                    if kind == "dir":
                        stack.append((node, sub))

    def _new(self, kind: Kind) -> ImageNode:
        node = ImageNode(self._next_id, kind)
        self._next_id += 1
        return node

    @staticmethod
    def _attach(parent: ImageNode, name: str, node: ImageNode) -> None:
        parent.children[name] = node
        node.names.add((parent, name))

    @staticmethod
    def _detach(parent: ImageNode, name: str) -> ImageNode:
        node = parent.children.pop(name)
        node.names.discard((parent, name))
        return node

    def path(self, node: ImageNode) -> str:
        """Where the node is on disk now: under one of its names, or in the orphan area."""
        parts: list[str] = []
        while node is not self.top:
            if not node.names:
                base = os.path.join(self.area, str(node.id))
                break
            node, name = min(node.names, key=lambda pn: (pn[0].id, pn[1]))
            parts.append(name)
        else:
            base = self.root
        return os.path.join(base, *reversed(parts))

    def relpath(self, node: ImageNode) -> str:
        return os.path.relpath(self.path(node), self.root)

    def _orphan_path(self, node: ImageNode) -> str:
        os.makedirs(self.area, mode=0o700, exist_ok=True)
        return os.path.join(self.area, str(node.id))

    def _is_ancestor(self, node: ImageNode, of: ImageNode) -> bool:
        """Whether directory ``node`` contains ``of`` in the image (or is it)."""
        cur = of
        while True:
            if cur is node:
                return True
            if cur is self.top or not cur.names:
                return False
            cur = next(iter(cur.names))[0]

    # --- file data -------------------------------------------------------------------

    def sync_file(
        self, node: ImageNode | None, live_fd: int, pending: Pending, *, meta: bool
    ) -> ImageNode:
        """fsync (``meta``) or fdatasync of a live file: copy what changed since the last
        sync (all of it for a file that had no durable inode) into the image."""
        st = os.fstat(live_fd)
        ranges, floor = pending.ranges(), pending.floor
        if node is None:
            node = self._new("file")
            path = self._orphan_path(node)
            _create(path, st)
            ranges, floor = [(0, st.st_size)], 0
        else:
            path = self.path(node)
        fd = os.open(path, os.O_WRONLY)
        try:
            if floor is not None and floor < os.fstat(fd).st_size:
                os.ftruncate(fd, floor)  # bytes a truncate cut off are zeros if regrown
            os.ftruncate(fd, st.st_size)
            for start, end in ranges:
                _copy(live_fd, fd, start, min(end, st.st_size))
        finally:
            os.close(fd)
        if meta:
            _copy_meta(path, st)
        return node

    def tear(self, node: ImageNode, offset: int, data: bytes) -> None:
        """A power cut in the middle of a write: ``data`` (a prefix) reached the disk."""
        if data:
            fd = os.open(self.path(node), os.O_WRONLY)
            try:
                os.pwrite(fd, data, offset)
            finally:
                os.close(fd)

    # --- directory entries -----------------------------------------------------------

    def sync_dir(self, node: ImageNode | None, live_fd: int, *, meta: bool) -> ImageNode:
        """fsync of a live directory: make its durable entries equal to its live ones.

        Each entry is matched by inode: a name whose inode changed is unlinked (or, for
        the inode's last durable name, moved to the orphan area) and the new inode linked
        or moved in. A directory has one durable name: naming it here moves it.
        """
        live: dict[str, os.stat_result] = {}
        with os.scandir(live_fd) as entries:
            for e in entries:
                live[e.name] = e.stat(follow_symlinks=False)
        if node is None:
            node = self._new("dir")
            os.mkdir(self._orphan_path(node), 0o700)
        for name, st in live.items():
            x = self.by_live.get(st.st_ino)
            moved = x is not None and x.kind == "dir" and node.children.get(name) is not x
            if moved and x is not None and self._is_ancestor(x, node):
                raise CycleError(name)
        dpath = self.path(node)
        for name, child in list(node.children.items()):
            st_or_none = live.get(name)
            if st_or_none is None or self.by_live.get(st_or_none.st_ino) is not child:
                self._unname(node, name, dpath)
        for name, st in live.items():
            x = self.by_live.get(st.st_ino)
            if x is not None and node.children.get(name) is x:
                continue
            target = os.path.join(dpath, name)
            if x is None:
                x = self._new(kind_of(st.st_mode))
                _create(target, st, link_target=_link_target(st, name, live_fd))
                self.by_live[st.st_ino] = x
            else:
                self._place(x, target)
            self._attach(node, name, x)
        if meta:
            _copy_meta(dpath, os.fstat(live_fd))
        return node

    def _unname(self, parent: ImageNode, name: str, dpath: str) -> None:
        child = self._detach(parent, name)
        where = os.path.join(dpath, name)
        if child.kind != "dir" and child.names:
            os.unlink(where)
        else:  # its last name: keep the inode, a later directory fsync may name it again
            os.rename(where, self._orphan_path(child))

    def _place(self, node: ImageNode, target: str) -> None:
        source = self.path(node)
        if node.kind == "dir":
            for parent, name in list(node.names):
                self._detach(parent, name)
            os.rename(source, target)
        elif node.names:
            os.link(source, target, follow_symlinks=False)
        else:
            os.rename(source, target)

    def sync_tree(self, live_root: str) -> list[int]:
        """Every live directory's entries, top down (what a whole-tree metadata flush makes
        durable); returns their live inodes. Top down, a directory is always placed before
        its children are looked at, so no directory can be moved into itself."""
        done = []
        for dirpath in _walk_dirs(live_root):
            fd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
            try:
                ino = os.fstat(fd).st_ino
                self.by_live[ino] = self.sync_dir(self.by_live.get(ino), fd, meta=True)
                done.append(ino)
            finally:
                os.close(fd)
        return done


def _walk_dirs(root: str) -> Iterator[str]:
    queue = [root]
    while queue:
        d = queue.pop(0)
        yield d
        with os.scandir(d) as entries:
            queue.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))


def _link_target(st: os.stat_result, name: str, dir_fd: int) -> str | None:
    return os.readlink(name, dir_fd=dir_fd) if stat.S_ISLNK(st.st_mode) else None


def _create(path: str, st: os.stat_result, *, link_target: str | None = None) -> None:
    """A new durable inode like the live one ``st``, with no data (none was fsynced)."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    elif stat.S_ISDIR(mode):
        os.mkdir(path, 0o700)
    elif stat.S_ISLNK(mode):
        assert link_target is not None
        os.symlink(link_target, path)
    else:
        os.mknod(path, stat.S_IFMT(mode) | 0o600, st.st_rdev)
    _copy_meta(path, st)


def _copy_meta(path: str, st: os.stat_result) -> None:
    """Mode, owner and times of the live inode onto the durable one."""
    # owner first: chown clears the set-id bits chmod then restores; a server not
    # running as root keeps its own uid
    with contextlib.suppress(PermissionError):
        os.chown(path, st.st_uid, st.st_gid, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(path, stat.S_IMODE(st.st_mode))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _copy(src: int, dst: int, start: int, end: int) -> None:
    while start < end:
        data = os.pread(src, min(_CHUNK, end - start), start)
        if not data:
            break
        os.pwrite(dst, data, start)
        start += len(data)
