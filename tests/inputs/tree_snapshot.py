"""A snapshot of a directory tree that does not follow symlinks, so "nothing outside
was touched" is one comparison of two snapshots."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

Tree = dict[str, tuple[str, int, str]]


def tree(root: Path) -> Tree:
    """Every entry under ``root``: kind, mode, and content digest (or link target)."""
    out: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = os.lstat(p)
            mode = stat.S_IMODE(st.st_mode)
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", mode, os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", mode, hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                out[rel] = ("dir" if stat.S_ISDIR(st.st_mode) else "other", mode, "")
    return out


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
