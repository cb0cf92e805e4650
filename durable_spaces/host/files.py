"""This host's file system, as every room sees it: what type of file a mode is (in the
words of a node listing, or of a message), and a directory's entries made durable.
No dependencies, so the harness, the adapter, the backends and the lab all import it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: A file's type by its ``stat`` test, as node listings name it (``FileStat.kind``, the
#: checker's ``Node.kind``); anything else is "other".
_KINDS = (
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "dir"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "chardev"),
    (stat.S_ISBLK, "blockdev"),
)
_WORDS = {
    "file": "a regular file",
    "dir": "a directory",
    "symlink": "a symbolic link",
    "fifo": "a FIFO",
    "socket": "a socket",
    "chardev": "a character device",
    "blockdev": "a block device",
}


def file_kind(mode: int) -> str:
    """file | dir | symlink | fifo | socket | chardev | blockdev | other."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "other"


def kind_words(mode: int) -> str:
    """What a file of ``mode`` is, for a message ("a symbolic link", "a FIFO")."""
    return _WORDS.get(file_kind(mode), "not a regular file")


def fsync_dir(directory: Path) -> None:
    """Make a new directory entry durable (a fresh file is not durable until its dir is)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir_durable(path: Path, mode: int = 0o700) -> None:
    """Create ``path`` and its missing parents so that each survives a power loss: each
    made, then the directory that holds it fsynced (``mkdir -p`` leaves every new entry
    to the next sync of its parent, which may never come before the power goes)."""
    missing: list[Path] = []
    p = path
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=mode)
        except FileExistsError:
            if not d.is_dir():
                raise
        fsync_dir(d.parent)
