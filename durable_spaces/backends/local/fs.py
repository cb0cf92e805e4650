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
start is not cached, since a rewrite in the same timestamp tick would look unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat as st
import time
import uuid
from collections.abc import Iterator, Sequence

from durable_spaces.errors import PathEscapeError
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


def read_file(root: str, path: str) -> bytes:
    parts = _parts(root, path)
    if not parts:
        raise IsADirectoryError(path)
    with _dir(root, parts[:-1]) as dfd:
        try:
            fd = os.open(
                parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
            )
        except OSError:
            if _is_symlink(parts[-1], dfd):
                raise PathEscapeError(f"refusing to read through the symlink {path!r}") from None
            raise
    with os.fdopen(fd, "rb") as f:
        if not st.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise IsADirectoryError(f"not a regular file: {path!r}")
        return f.read()


@contextlib.contextmanager
def _staging(staging: str | None, dfd: int) -> Iterator[int]:
    """Where temporaries are made: ``staging`` (a directory beside the workspace, on the
    same filesystem, so a crash between create and rename leaves nothing in the
    workspace), else the target's own directory."""
    if staging is None:
        yield dfd
        return
    os.makedirs(staging, mode=0o700, exist_ok=True)
    sfd = os.open(staging, _DIR_FLAGS)
    try:
        yield sfd
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
    if st.S_ISREG(mode):
        return "file"
    if st.S_ISDIR(mode):
        return "dir"
    if st.S_ISLNK(mode):
        return "symlink"
    return "other"


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


def _sha256(name: str, dir_fd: int) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


_Sig = tuple[int, int, int, int]


class Scanner:
    """Per-Space scan cache: workspace-relative path -> (stat signature, sha256).

    ``stats["hashed"]`` counts files actually hashed (cumulative), so a test can prove
    that an unchanged file is not read again.
    """

    def __init__(self) -> None:
        self._cache: dict[str, tuple[_Sig, str]] = {}
        self.stats: dict[str, int] = {"hashed": 0, "scans": 0, "files": 0}

    def scan(self, root: str, path: str = ".", exclude: Sequence[str] = ()) -> PathTable:
        parts = _parts(root, path)
        top = "/".join(parts) or "."
        excl = [confine(root, e) for e in exclude]
        if "." in excl:
            return {}
        start = time.time_ns()
        table: PathTable = {}
        fresh: dict[str, tuple[_Sig, str]] = {}
        try:
            with _dir(root, parts) as dfd:
                self._walk(dfd, top, excl, start, table, fresh, len(parts))
        except (FileNotFoundError, NotADirectoryError):
            pass
        if top == ".":
            self._cache = fresh
        else:
            for k in [k for k in self._cache if k == top or k.startswith(top + "/")]:
                del self._cache[k]
            self._cache.update(fresh)
        self.stats["scans"] += 1
        self.stats["files"] = len(table)
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
                            enter(sub, rel)
                        except BaseException:
                            os.close(sub)
                            raise
                    elif st.S_ISREG(s.st_mode):
                        self._file(e, dfd, rel, s, start, table, fresh)
                    # fifos, sockets, devices: not representable in the image, skipped
                except (FileNotFoundError, NotADirectoryError):
                    continue  # vanished while scanning (a command is still writing)
        finally:
            for dfd, _, _ in stack:
                os.close(dfd)

    def _file(
        self,
        e: os.DirEntry[str],
        dfd: int,
        rel: str,
        s: os.stat_result,
        start: int,
        table: PathTable,
        fresh: dict[str, tuple[_Sig, str]],
    ) -> None:
        sig = (s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns)
        cached = self._cache.get(rel)
        if cached is not None and cached[0] == sig:
            sha = cached[1]
        else:
            sha = _sha256(e.name, dfd)
            self.stats["hashed"] += 1
        if max(s.st_mtime_ns, s.st_ctime_ns) < start - RACY_NS:
            fresh[rel] = (sig, sha)
        table[rel] = PathEntry(kind="file", mode=s.st_mode & 0o777, size=s.st_size, sha256=sha)
