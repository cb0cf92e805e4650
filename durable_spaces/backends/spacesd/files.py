"""The reads of a daemon's Space through its file API, with its paths confined.

Paths: ``confine()`` lexically, then every existing component is ``lstat``-ed through
the daemon and a symlink among them is refused (``PathEscapeError``), as in
``local_fs``. There is a TOCTOU window between the check and the daemon's operation (a
command running at the same moment could swap a directory for a symlink): the daemon
has no ``openat``-style confined API to close it, so confinement here holds against
paths the adapter is given, not against a concurrent hostile command. The changes go
through commands instead (``mutate``), which carry the caller's epoch.
"""

from __future__ import annotations

import errno
import posixpath
from collections.abc import Awaitable, Callable
from typing import Any

from durable_spaces.errors import PathEscapeError
from durable_spaces.space import FileStat, confine

#: ``SpacesdSpace._call``: one SDK method of the daemon, its errors mapped.
Call = Callable[..., Awaitable[Any]]


class DaemonFiles:
    """The workspace at ``root`` of one daemon, read through ``call`` (module doc)."""

    def __init__(self, root: str, call: Call) -> None:
        self.root = root
        self._call = call

    def abs(self, rel: str) -> str:
        """The daemon's path of the workspace-relative ``rel``."""
        return self.root if rel == "." else posixpath.join(self.root, rel)

    async def lstat(self, rel: str) -> Any | None:
        """The daemon's lstat of ``rel``; None when it is missing."""
        try:
            return await self._call("stat", self.abs(rel), no_follow=True)
        except (FileNotFoundError, NotADirectoryError):
            return None

    async def resolve(self, path: str, *, follow_last: bool) -> str:
        return (await self.resolve_stat(path, follow_last=follow_last))[0]

    async def resolve_stat(self, path: str, *, follow_last: bool) -> tuple[str, Any | None]:
        """Workspace-relative ``path``, after checking that no existing component is a
        symlink (inside-pointing or not, like the local backend: the adapter never needs
        to go through one). With ``follow_last=False`` the last component is not checked
        (lstat semantics: it is replaced, removed or described, never followed). Also the
        last component's lstat when it was looked at (None: missing or not looked at)."""
        rel = confine(self.root, path)
        parts = [] if rel == "." else rel.split("/")
        check = parts if follow_last else parts[:-1]
        last = None
        for i in range(len(check)):
            here = "/".join(parts[: i + 1])
            st = await self.lstat(here)
            if st is None:
                break  # nothing below a missing component exists yet
            if st.kind == "symlink":
                raise PathEscapeError(f"refusing to go through the symlink {here!r} ({path!r})")
            if i == len(parts) - 1:
                last = st
        return rel, last

    async def read_file(self, path: str) -> bytes:
        """``Space.read_file``."""
        if not path:
            raise IsADirectoryError(errno.EISDIR, "the path is empty: name a file in the workspace")
        rel, st = await self.resolve_stat(path, follow_last=True)
        if rel != "." and st is None:
            raise FileNotFoundError(errno.ENOENT, f"no such file: {path!r}")
        if st is None or st.kind == "directory":
            raise IsADirectoryError(errno.EISDIR, f"{path!r} is a directory, not a file")
        if st.kind != "file":  # a FIFO would block the daemon's read forever
            raise IsADirectoryError(errno.EISDIR, f"{path!r} is not a regular file (a {st.kind})")
        return bytes(await self._call("download", self.abs(rel)))

    async def stat(self, path: str) -> FileStat | None:
        """``Space.stat``."""
        rel = await self.resolve(path, follow_last=False)
        st = await self.lstat(rel)
        if st is None:
            return None
        kind = {"file": "file", "directory": "dir", "symlink": "symlink"}.get(st.kind, "other")
        return FileStat(
            path=rel,
            kind=kind,
            mode=int(st.mode) & 0o777,
            size=int(st.size),
            mtime_ns=int(st.modified_ms or 0) * 1_000_000,
            target=st.symlink_target if kind == "symlink" else None,
        )

    async def list_dir(self, path: str = ".") -> list[str]:
        """``Space.list_dir``."""
        rel = await self.resolve(path, follow_last=True)
        entries = await self._call("list_dir", self.abs(rel), 1)
        return sorted(e.name for e in entries)
