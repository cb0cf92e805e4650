"""The workspace as an incremental checkpoint sees it: every path with its stat key, and
the bytes of the files whose key changed since the last checkpoint.

Two ways to get it, the same result:

- ``walk_host``: when the workspace is a directory of this host (``local``, ``spacesd``;
  proven per Space by a probe file, see ``snapshots``), one walk of it here, reading
  nothing but what changed. Directories are opened relative to their parent with
  ``O_NOFOLLOW`` and files with ``O_NOFOLLOW | O_NONBLOCK`` after a check that they are
  regular, so a symlink or FIFO swapped in mid-walk is never followed or opened. It only
  reads: what it writes goes beside the workspace, never into it.
- ``list_script`` / ``parse_listing``: one command in the Space (``find -printf`` then a
  ``tar`` of the files whose ctime is not older than the last listing), and ``fetch_argv``
  for the files the ``tar`` missed.

A stat key is (kind, mode, size, inode, mtime, ctime): any write, chmod or rename of a
file changes its ctime, which no user can set back. A file touched within ``RACY_NS`` of
a listing is not trusted next time (a rewrite in the same clock tick looks unchanged).
A tree that changes under a walk (a directory swapped for a link) raises ``TreeChanged``;
the caller lists again.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from durable_spaces.adapter.checkpoints.manifest import BLOB_NAME, DIR, FILE, ROOT, SYMLINK
from durable_spaces.space import WorkspaceJournal

#: Timestamps this close to a listing are not trusted for the next one (as the scans).
RACY_NS = 50_000_000

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class TreeChanged(Exception):
    """The workspace changed under a listing in a way it cannot describe: list again."""


class TreeNode(NamedTuple):
    """One listed path: its kind (``manifest`` letters), permission bits, and stat key
    (equal nodes: the file did not change, see the module doc)."""

    kind: str
    mode: int
    size: int = 0
    ino: int = 0
    nlink: int = 1
    mtime_ns: int = 0
    ctime_ns: int = 0
    target: str | None = None  # symlinks

    def trusted(self, clock_ns: int) -> bool:
        """Whether the key can stand for the content at the next listing."""
        return max(self.mtime_ns, self.ctime_ns) < clock_ns - RACY_NS


@dataclass
class TreeListing:
    clock_ns: int  # the Space's clock when the listing began
    nodes: dict[str, TreeNode] = field(default_factory=dict)


def dir_node(st: os.stat_result) -> TreeNode:
    return TreeNode(
        DIR, st.st_mode & 0o7777, 0, st.st_ino, st.st_nlink, st.st_mtime_ns, st.st_ctime_ns
    )


#: ``take(path, node, fd)`` gets the open descriptor of a file ``want`` asked for.
Take = Callable[[str, TreeNode, int], None]
Want = Callable[[str, TreeNode], bool]


def walk_host(
    root: str, want: Want, take: Take, watch: WorkspaceJournal | None = None
) -> TreeListing:
    """List the workspace at the host path ``root`` (module doc). With ``watch``, each
    directory is watched before it is listed and each regular file before its
    ``lstat``: a change after that is an event (``space.WorkspaceJournal``)."""
    listing = TreeListing(time.time_ns())
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if watch is not None:
        watch.dir(ROOT, top)
    stack: list[tuple[str, int]] = [("", top)]
    try:
        listing.nodes[ROOT] = dir_node(os.fstat(top))
        walk_stack(stack, listing.nodes, want, take, watch)
    finally:
        for _, fd in stack:  # left by an error
            os.close(fd)
    return listing


def walk_stack(
    stack: list[tuple[str, int]],
    nodes: dict[str, TreeNode],
    want: Want,
    take: Take,
    watch: WorkspaceJournal | None,
) -> None:
    """Walk every (prefix, open directory) of ``stack`` and all below them into
    ``nodes``, closing each directory after listing it (and, on an error, every one
    still on the stack)."""
    try:
        while stack:
            prefix, dfd = stack.pop()
            try:
                _walk_dir(prefix, dfd, nodes, want, take, stack, watch)
            except (FileNotFoundError, NotADirectoryError) as e:
                # Listed, then gone or replaced before its stat: the tree changed under
                # the walk (never "the whole directory is gone": a caller that drops
                # what is missing would drop what it had walked).
                raise TreeChanged(f"{prefix}{e.filename or ''}: {e.strerror}") from None
            finally:
                os.close(dfd)
    except BaseException:
        for _, fd in stack:
            os.close(fd)
        stack.clear()
        raise


def _walk_dir(
    prefix: str,
    dfd: int,
    nodes: dict[str, TreeNode],
    want: Want,
    take: Take,
    stack: list[tuple[str, int]],
    watch: WorkspaceJournal | None,
) -> None:
    with os.scandir(dfd) as it:
        for e in it:
            name = e.name
            rel = prefix + name
            if watch is not None and e.is_file(follow_symlinks=False):
                watch.file(rel, dfd, name)  # then a fresh lstat, not the entry's cache
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            else:
                st = e.stat(follow_symlinks=False)
            m = st.st_mode
            if stat.S_ISREG(m):
                node = file_node(st)
                if want(rel, node):
                    node = take_file(rel, name, dfd, take)
            elif stat.S_ISDIR(m):
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=dfd)
                except OSError as err:
                    raise TreeChanged(f"{rel!r}: {err.strerror}") from None
                stack.append((rel + "/", sub))
                if watch is not None:
                    watch.dir(rel, sub)  # before it is listed
                node = dir_node(os.fstat(sub))
            elif stat.S_ISLNK(m):
                node = link_node(st, os.readlink(name, dir_fd=dfd))
            else:
                continue  # FIFOs, sockets, devices: never in a checkpoint
            nodes[rel] = node


def file_node(st: os.stat_result) -> TreeNode:
    return TreeNode(
        FILE, st.st_mode & 0o7777, st.st_size, st.st_ino, st.st_nlink, st.st_mtime_ns,
        st.st_ctime_ns,
    )  # fmt: skip


def link_node(st: os.stat_result, target: str) -> TreeNode:
    return TreeNode(SYMLINK, 0o777, 0, st.st_ino, 1, st.st_mtime_ns, st.st_ctime_ns, target)


def take_file(rel: str, name: str, dfd: int, take: Take) -> TreeNode:
    """Open the regular file ``name`` of ``dfd`` without following links or blocking,
    hand it to ``take``, and return its node as the open file says."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
    except OSError as err:
        raise TreeChanged(f"{rel!r}: {err.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TreeChanged(f"{rel!r} is no longer a regular file")
        node = file_node(st)
        take(rel, node, fd)
        return node
    finally:
        os.close(fd)


@contextlib.contextmanager
def host_dir(root: str, parts: list[str]) -> Iterator[int]:
    """The directory ``root/parts...``, every step opened without following a link;
    FileNotFoundError when one is gone or no longer a directory."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                sub = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    raise FileNotFoundError(e.errno, e.strerror, part) from None
                raise
            os.close(fd)
            fd = sub
        yield fd
    finally:
        os.close(fd)


# --- the same through a command in the Space -------------------------------------------

_FORMAT = r"%y\0%P\0%m\0%s\0%i\0%n\0%T@\0%C@\0%l\0"
#: Marks the end of the listing in the command's output (no ``%y`` is ``E``).
END = b"E\0"


def list_script(root: str, since_ns: int | None, copy: str) -> str:
    """Shell (``root`` and ``copy``, the Space's copy directory, quoted by the caller):
    the Space's clock, the listing, ``END``, the blobs the copy holds, ``END``, then a
    tar of the files changed since ``since_ns`` (every file when None)."""
    newer = "" if since_ns is None else f"-newerct @{since_ns // 10**9}.{since_ns % 10**9:09d} "
    return (
        f"cd {root} || exit 9; date +%s%N; "
        rf"find . \( -type f -o -type d -o -type l \) -printf '{_FORMAT}' && printf 'E\0' && "
        f'{{ c={copy}; b="$c/blobs"; '
        'if [ ! -L "$c" ] && [ -d "$b" ] && [ ! -L "$b" ]; then '
        "find \"$b\" -mindepth 1 -maxdepth 1 -type f -printf '%f\\0'; fi; }; printf 'E\\0' && "
        f"find . -type f {newer}-print0 | "
        "tar --null --no-recursion --ignore-failed-read -T - -cf - 2>/dev/null"
    )


#: The files named NUL-separated on stdin (``./``-prefixed), as a tar, run in the root.
#: Its warnings go nowhere: a Space merges stderr into the output, and "Cannot open" in
#: the middle of the tar made it unreadable (a file of mode 000 in a Space whose
#: commands are not root); a file left out is read alone or reported by the caller.
FETCH_ARGV = (
    "sh", "-c", "exec tar --null --no-recursion --ignore-failed-read -T - -cf - 2>/dev/null",
)  # fmt: skip


def fetch_input(paths: list[str]) -> bytes:
    return b"".join(b"./" + p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)


def parse_listing(out: bytes) -> tuple[TreeListing, set[str], dict[str, bytes]]:
    """The output of ``list_script``: the listing, the blobs of the Space's copy, and
    the files its tar holds."""
    clock, _, rest = out.partition(b"\n")
    listing = TreeListing(int(clock))
    pos = 0
    while not rest.startswith(END, pos):
        fields = []
        for _ in range(9):
            end = rest.index(b"\0", pos)
            fields.append(rest[pos:end])
            pos = end + 1
        y, name, mode, size, ino, nlink, mtime, ctime, target = fields
        kind = {b"f": FILE, b"d": DIR, b"l": SYMLINK}[y]
        rel = name.decode("utf-8", "surrogateescape") or ROOT
        listing.nodes[rel] = TreeNode(
            kind,
            0o777 if kind == SYMLINK else int(mode, 8),
            int(size) if kind == FILE else 0,
            int(ino),
            int(nlink),
            _ns(mtime),
            _ns(ctime),
            target.decode("utf-8", "surrogateescape") if kind == SYMLINK else None,
        )
    pos += len(END)
    end = rest.index(END, pos)  # blob names are hex: no E in them
    names = (n.decode("utf-8", "surrogateescape") for n in rest[pos:end].split(b"\0"))
    blobs = {n for n in names if BLOB_NAME.fullmatch(n)}
    return listing, blobs, parse_files(rest[end + len(END) :])


def parse_files(data: bytes) -> dict[str, bytes]:
    """The regular files of a tar (``./`` stripped); other members are left out."""
    files: dict[str, bytes] = {}
    if not data.strip(b"\0"):
        return files
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:", errors="surrogateescape") as tar:
        for m in tar:
            if m.isfile():
                f = tar.extractfile(m)
                rel = m.name[2:] if m.name.startswith("./") else m.name
                files[rel] = f.read() if f is not None else b""
    return files


def _ns(text: bytes) -> int:
    sec, _, frac = text.partition(b".")
    return int(sec) * 10**9 + int((frac + b"000000000")[:9])
