"""Workspace file operations that never follow a symlink, and the incremental scanner.

``confine`` (adapter/space.py) is the lexical half of confinement; this is the other
half, for backends whose workspace is a directory on this machine. Every path is walked
one component at a time from an fd of the workspace root (openat-style, ``O_NOFOLLOW``),
and any component that is a symlink is refused, inside-pointing or not. Resolving "safe"
symlinks was rejected: it needs a second lexical check after every hop, and the adapter
has no need to go through links (it stores them as links). The last component is
handled with ``*at`` calls on its parent's fd, so a symlink there is replaced or removed,
never written through; ``stat`` is ``lstat``.

The scanner re-hashes a file only when its (size, mtime_ns, inode, ctime_ns) changed. Like
git's "racily clean" rule, a file whose mtime or ctime is within ``RACY_NS`` of the scan's
start is not cached, since a rewrite in the same timestamp tick would look unchanged. A
``Watch`` given to a scan (the change journal, ``journal.py``) is told of each directory
before it is listed and of each file before it is looked at, so that any change after
the scan read something is an event. The bytes of the small files a scan hashed are
kept (``Scanner.kept``) until the next scan: reading them back costs nothing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat as st
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Protocol

from durable_spaces.errors import PathEscapeError
from durable_spaces.host.files import file_kind
from durable_spaces.space import (
    MAX_SCAN_DEPTH,
    FileStat,
    PathEntry,
    PathTable,
    confine,
    name_problem,
    unsupported,
)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Timestamps this close to a scan's start are not trusted for caching (kernel ticks are
#: a few ms; this is an order of magnitude more).
RACY_NS = 50_000_000
#: The bytes of a hashed file are kept for ``read_files`` up to this size, and up to
#: ``KEEP_TOTAL`` per scan (the image's default ``max_bytes``).
KEEP_FILE = 1 << 20
KEEP_TOTAL = 16 << 20


def _parts(root: str, path: str) -> list[str]:
    rel = confine(root, path)
    return [] if rel == "." else rel.split("/")


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return st.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _open_dir(name: str, dir_fd: int) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        if _is_symlink(name, dir_fd):
            raise PathEscapeError(f"refusing to go through the symlink {name!r}") from None
        raise


@contextlib.contextmanager
def _dir(root: str, parts: Sequence[str], create: bool = False) -> Iterator[int]:
    """An fd of the directory ``parts`` under ``root``, walked without following links."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            nfd = _open_dir(name, fd)
            os.close(fd)
            fd = nfd
        yield fd
    finally:
        os.close(fd)


def not_a_file(path: str, what: str) -> IsADirectoryError:
    """What a read of something that is not a regular file raises, in one clear line
    (not the bare path, nor ``open``'s descriptor number as the file's name)."""
    if what == "dir":
        return IsADirectoryError(errno.EISDIR, f"{path!r} is a directory, not a file")
    return IsADirectoryError(errno.EISDIR, f"{path!r} is not a regular file (a {what})")


def _what(mode: int) -> str:
    return "dir" if st.S_ISDIR(mode) else "fifo" if st.S_ISFIFO(mode) else "special file"


def read_file(root: str, path: str) -> bytes:
    if not path:
        raise IsADirectoryError(errno.EISDIR, "the path is empty: name a file in the workspace")
    parts = _parts(root, path)
    if not parts:
        raise not_a_file(path, "dir")  # the workspace itself
    with _dir(root, parts[:-1]) as dfd:
        try:
            fd = os.open(
                parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
            )
        except OSError:
            if _is_symlink(parts[-1], dfd):
                raise PathEscapeError(f"refusing to read through the symlink {path!r}") from None
            raise
    mode = os.fstat(fd).st_mode
    if not st.S_ISREG(mode):  # before fdopen: it names a directory by its descriptor
        os.close(fd)
        raise not_a_file(path, _what(mode))
    with os.fdopen(fd, "rb") as f:
        return f.read()


@contextlib.contextmanager
def _staging(staging: str | None, dfd: int) -> Iterator[int]:
    """Where temporaries are made: ``staging`` (a directory beside the workspace, so a
    crash between create and rename leaves nothing in the workspace), else, or when
    ``staging`` is on another filesystem than the target (a rename cannot cross one: a
    Space's state kept on another disk than its workspace), the target's own directory:
    there a crash between create and rename can leave a ``.ds-tmp-*`` file behind."""
    if staging is None:
        yield dfd
        return
    os.makedirs(staging, mode=0o700, exist_ok=True)
    sfd = os.open(staging, _DIR_FLAGS)
    try:
        yield sfd if os.fstat(sfd).st_dev == os.fstat(dfd).st_dev else dfd
    finally:
        os.close(sfd)


def write_file(
    root: str, path: str, data: bytes, mode: int | None = None, staging: str | None = None
) -> None:
    """Write a temporary file then rename it over ``path``: atomic, and a symlink at
    ``path`` is replaced by the file instead of being written through."""
    parts = _parts(root, path)
    if not parts:
        raise IsADirectoryError(path)
    name = parts[-1]
    with _dir(root, parts[:-1], create=True) as dfd, _staging(staging, dfd) as sfd:
        if mode is None:
            try:
                old = os.lstat(name, dir_fd=dfd)
                mode = st.S_IMODE(old.st_mode) if st.S_ISREG(old.st_mode) else 0o644
            except FileNotFoundError:
                mode = 0o644
        tmp = f".ds-tmp-{uuid.uuid4().hex[:12]}"
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=sfd,
        )
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                os.fchmod(f.fileno(), mode & 0o7777)
            os.rename(tmp, name, src_dir_fd=sfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=sfd)
            raise


def symlink(root: str, path: str, target: str, staging: str | None = None) -> None:
    parts = _parts(root, path)
    if not parts:
        raise IsADirectoryError(path)
    with _dir(root, parts[:-1], create=True) as dfd, _staging(staging, dfd) as sfd:
        tmp = f".ds-tmp-{uuid.uuid4().hex[:12]}"
        os.symlink(target, tmp, dir_fd=sfd)
        try:
            os.rename(tmp, parts[-1], src_dir_fd=sfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=sfd)
            raise


def _kind(mode: int) -> str:
    """``FileStat.kind``: what the Space protocol names (``host.files.file_kind``'s others
    are "other")."""
    kind = file_kind(mode)
    return kind if kind in ("file", "dir", "symlink") else "other"


def stat(root: str, path: str) -> FileStat | None:
    parts = _parts(root, path)
    rel = "/".join(parts) or "."
    try:
        with _dir(root, parts[:-1]) as dfd:
            name = parts[-1] if parts else "."
            s = os.lstat(name, dir_fd=dfd)
            target = os.readlink(name, dir_fd=dfd) if st.S_ISLNK(s.st_mode) else None
    except (FileNotFoundError, NotADirectoryError):
        return None
    return FileStat(
        path=rel,
        kind=_kind(s.st_mode),
        mode=s.st_mode & 0o777,
        size=s.st_size,
        mtime_ns=s.st_mtime_ns,
        target=target,
    )


def list_dir(root: str, path: str = ".") -> list[str]:
    with _dir(root, _parts(root, path)) as dfd:
        return sorted(os.listdir(dfd))


def remove(root: str, path: str, recursive: bool = False) -> None:
    parts = _parts(root, path)
    if not parts:
        raise PathEscapeError("refusing to remove the workspace root")
    try:
        with _dir(root, parts[:-1]) as dfd:
            name = parts[-1]
            try:
                s = os.lstat(name, dir_fd=dfd)
            except FileNotFoundError:
                return
            if not st.S_ISDIR(s.st_mode):
                os.unlink(name, dir_fd=dfd)
            elif recursive:
                _rmtree_at(dfd, name)
            else:
                os.rmdir(name, dir_fd=dfd)
    except (FileNotFoundError, NotADirectoryError):
        return


def _rmtree_at(dfd: int, name: str) -> None:
    """Remove the directory ``name`` of ``dfd`` and all below it: fd-based (never through
    a symlink), iterative (``shutil.rmtree`` of Python 3.11 recurses, and a command can
    make a tree deeper than the recursion limit) and with two fds open at most (each
    subdirectory is first renamed up beside ``name``, so depth never costs fds)."""
    queue = [name]
    while queue:
        here = queue.pop()
        fd = _open_dir(here, dfd)
        try:
            with os.scandir(fd) as it:
                for e in list(it):
                    if e.is_dir(follow_symlinks=False):
                        moved = f".ds-rm-{uuid.uuid4().hex[:12]}"
                        os.rename(e.name, moved, src_dir_fd=fd, dst_dir_fd=dfd)
                        queue.append(moved)
                    else:
                        os.unlink(e.name, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(here, dir_fd=dfd)


def _sha256(name: str, dir_fd: int, keep: bool = False) -> tuple[str, bytes | None]:
    """The file's sha256, and its bytes when ``keep`` (read once, hashed in memory)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        if keep:
            data = f.read()
            return hashlib.sha256(data).hexdigest(), data
        return hashlib.file_digest(f, "sha256").hexdigest(), None


_Sig = tuple[int, int, int, int]


class Watch(Protocol):
    """What a scan tells a change journal: a directory before it is listed (``fd`` is
    open on it), a regular file before it is stat-ed and read (``name`` in ``dir_fd``)."""

    def dir(self, rel: str, fd: int) -> None: ...

    def file(self, rel: str, dir_fd: int, name: str) -> None: ...


class Scanner:
    """Per-Space scan cache: workspace-relative path -> (stat signature, sha256).

    ``stats["hashed"]`` counts files actually hashed (cumulative), so a test can prove
    that an unchanged file is not read again. ``kept`` holds the bytes of the files the
    last scan hashed (small ones, ``KEEP_FILE``/``KEEP_TOTAL``), by path.
    """

    def __init__(self) -> None:
        self._cache: dict[str, tuple[_Sig, str]] = {}
        self.stats: dict[str, int] = {"hashed": 0, "scans": 0, "files": 0}
        self.kept: dict[str, bytes] = {}
        self._kept_bytes = 0

    def begin(self) -> int:
        """Start a scan: forget the last one's bytes; returns the scan's start time."""
        self.kept = {}
        self._kept_bytes = 0
        return time.time_ns()

    def scan(
        self,
        root: str,
        path: str = ".",
        exclude: Sequence[str] = (),
        watch: Watch | None = None,
    ) -> PathTable:
        parts = _parts(root, path)
        top = "/".join(parts) or "."
        excl = [confine(root, e) for e in exclude]
        if "." in excl:
            return {}
        start = self.begin()
        table: PathTable = {}
        fresh: dict[str, tuple[_Sig, str]] = {}
        try:
            with _dir(root, parts) as dfd:
                if watch is not None:
                    watch.dir(top, dfd)
                self._walk(dfd, top, excl, start, table, fresh, len(parts), watch)
        except (FileNotFoundError, NotADirectoryError):
            pass
        if top == ".":
            self._cache = fresh
        else:
            self._forget(top)
            self._cache.update(fresh)
        self.stats["scans"] += 1
        self.stats["files"] = len(table)
        return table

    def _forget(self, top: str) -> None:
        for k in [k for k in self._cache if k == top or k.startswith(top + "/")]:
            del self._cache[k]

    def subtree(
        self,
        dfd: int,
        top: str,
        excl: list[str],
        start: int,
        watch: Watch | None,
    ) -> PathTable:
        """The entries under the directory ``top`` (open as ``dfd``), for a journal's
        rescan of a directory that appeared or moved: the walk of ``scan``."""
        table: PathTable = {}
        fresh: dict[str, tuple[_Sig, str]] = {}
        self._walk(dfd, top, excl, start, table, fresh, top.count("/") + 1, watch)
        self._forget(top)
        self._cache.update(fresh)
        return table

    def _walk(
        self,
        top_fd: int,
        top: str,
        excl: list[str],
        start: int,
        table: PathTable,
        fresh: dict[str, tuple[_Sig, str]],
        top_depth: int,
        watch: Watch | None = None,
    ) -> None:
        """Depth first, with an explicit stack (a tree a command made thousands of levels
        deep must not exhaust Python's recursion), holding one open fd per level at most
        ``MAX_SCAN_DEPTH`` deep; a deeper tree is one ``unsupported`` entry."""
        stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = []

        def enter(fd: int, prefix: str) -> None:
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
            stack.append((fd, prefix, iter(entries)))

        enter(os.dup(top_fd), top)
        try:
            while stack:
                dfd, prefix, it = stack[-1]
                e = next(it, None)
                if e is None:
                    stack.pop()
                    os.close(dfd)
                    continue
                rel = e.name if prefix == "." else f"{prefix}/{e.name}"
                if any(rel == x or rel.startswith(x + "/") for x in excl):
                    continue
                why = name_problem(e.name)
                if why is not None:
                    table[rel] = unsupported(why)
                    continue
                try:
                    if watch is not None and e.is_file(follow_symlinks=False):
                        watch.file(rel, dfd, e.name)  # before the stat: later changes are events
                        s = os.lstat(e.name, dir_fd=dfd)
                    else:
                        s = e.stat(follow_symlinks=False)
                    if st.S_ISLNK(s.st_mode):
                        table[rel] = PathEntry(
                            kind="symlink", mode=0o777, target=os.readlink(e.name, dir_fd=dfd)
                        )
                    elif st.S_ISDIR(s.st_mode):
                        if top_depth + len(stack) >= MAX_SCAN_DEPTH:
                            table[rel] = unsupported(f"deeper than {MAX_SCAN_DEPTH} levels")
                            continue
                        sub = _open_dir(e.name, dfd)
                        try:
                            if watch is not None:
                                watch.dir(rel, sub)  # before the listing
                            enter(sub, rel)
                        except BaseException:
                            os.close(sub)
                            raise
                    elif st.S_ISREG(s.st_mode):
                        table[rel] = self.file_entry(dfd, e.name, rel, s, start, fresh)
                    # fifos, sockets, devices: not representable in the image, skipped
                except (FileNotFoundError, NotADirectoryError):
                    continue  # vanished while scanning (a command is still writing)
        finally:
            for dfd, _, _ in stack:
                os.close(dfd)

    def file_entry(
        self,
        dfd: int,
        name: str,
        rel: str,
        s: os.stat_result,
        start: int,
        fresh: dict[str, tuple[_Sig, str]] | None = None,
        cached: bool = True,
    ) -> PathEntry:
        """The entry of the regular file ``name`` of ``dfd`` whose lstat is ``s``: hashed
        unless ``cached`` and its signature is the cache's (``cached=False``: a journal
        said it changed). Non-racy results go into ``fresh`` (or the cache itself)."""
        sig = (s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns)
        hit = self._cache.get(rel) if cached else None
        if hit is not None and hit[0] == sig:
            sha = hit[1]
        else:
            keep = s.st_size <= KEEP_FILE and self._kept_bytes + s.st_size <= KEEP_TOTAL
            sha, data = _sha256(name, dfd, keep)
            self.stats["hashed"] += 1
            if data is not None:
                self.kept[rel] = data
                self._kept_bytes += len(data)
        target = self._cache if fresh is None else fresh
        if max(s.st_mtime_ns, s.st_ctime_ns) < start - RACY_NS:
            target[rel] = (sig, sha)
        else:
            target.pop(rel, None)
        return PathEntry(kind="file", mode=s.st_mode & 0o777, size=s.st_size, sha256=sha)
