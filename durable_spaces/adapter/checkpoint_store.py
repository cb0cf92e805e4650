"""Where workspace checkpoints live outside any Space: the ``CheckpointStore`` protocol
and ``DirectoryCheckpointStore``, a directory of ``<id>.tar`` files.

A store is read back after crashes and may be shared, so it trusts nothing it finds:
names are checkpoint ids that parse (``checkpoint_id``), files are opened without
following symlinks, and anything but a regular file is a bad copy, not a crash.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Protocol, runtime_checkable

from durable_spaces.adapter.checkpoint_id import CheckpointId
from durable_spaces.errors import CheckpointCopyError


@runtime_checkable
class CheckpointStore(Protocol):
    """Workspace checkpoints kept outside any Space, keyed by id. Writes are atomic; the
    id records the tar's digest, so an id always names the same bytes.

    ``get`` returns None when the checkpoint is not there and raises
    ``CheckpointCopyError`` when what is there is not a usable copy (a symlink, a
    directory, unreadable); callers verify the bytes against the id either way."""

    def put(self, checkpoint_id: str, data: bytes) -> None: ...

    def get(self, checkpoint_id: str) -> bytes | None: ...

    def delete(self, checkpoint_id: str) -> None: ...


class DirectoryCheckpointStore:
    """A directory (local or shared) of ``<id>.tar`` files, written tmp + fsync + rename.

    The directory is 0700 and its files 0600 (it holds whole workspaces). Only valid
    workspace ids name files; files are opened with ``O_NOFOLLOW`` after an ``lstat``,
    so a symlink, FIFO or device planted here is refused as a bad copy, never followed
    or opened. ``put`` of an id whose file is there but damaged replaces it."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(OSError):
            st = self.dir.stat()
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
                self.dir.chmod(0o700)

    def _path(self, checkpoint_id: str) -> tuple[CheckpointId, Path]:
        cid = CheckpointId.parse(checkpoint_id, f"checkpoint store {self.dir}", "workspace")
        return cid, self.dir / f"{cid}.tar"

    def location(self, checkpoint_id: str) -> str:
        """The file that holds (or would hold) the checkpoint, for messages."""
        return str(self._path(checkpoint_id)[1])

    def ids(self) -> list[CheckpointId]:
        """The checkpoints in the store (files whose name is not an id are ignored)."""
        found = (
            CheckpointId.valid(p.name.removesuffix(".tar"), "workspace")
            for p in self.dir.glob("*.tar")
        )
        return sorted(c for c in found if c is not None)

    def put(self, checkpoint_id: str, data: bytes) -> None:
        cid, path = self._path(checkpoint_id)
        if not cid.matches(data):
            raise CheckpointCopyError(f"refusing to store bytes that are not checkpoint {cid}")
        with contextlib.suppress(CheckpointCopyError):
            old = self.get(cid)
            if old is not None and cid.matches(old):
                return  # already there, intact
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # replaces a planted symlink itself, never its target
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def get(self, checkpoint_id: str) -> bytes | None:
        _, path = self._path(checkpoint_id)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CheckpointCopyError(f"{path}: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointCopyError(f"{path} is {_kind(st.st_mode)}, not a regular file")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CheckpointCopyError(f"{path}: {e.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped since the lstat
                raise CheckpointCopyError(f"{path} is not a regular file")
            return f.read()

    def delete(self, checkpoint_id: str) -> None:
        self._path(checkpoint_id)[1].unlink(missing_ok=True)


#: ``stat.filemode``'s first letter -> what a file of that type is, for messages.
_KINDS = {"l": "a symlink", "d": "a directory", "p": "a FIFO", "s": "a socket"}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.filemode(mode)[0], "a device node")
