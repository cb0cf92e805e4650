"""Which host directories have every change go through this kernel, so that its inotify
events report them all: the mount tables' answer (``/proc/<pid>/mountinfo``), for the
change journal of a workspace (``backends/local/journal.py``) and the watch on a
checkpoint copy's blobs (``adapter/checkpoints/copy_watch.py``).
"""

from __future__ import annotations

__all__ = ["LOCAL_FILESYSTEMS", "mount_problem"]

#: Filesystems whose every change goes through this kernel's VFS (and so its events).
LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "zfs", "overlay"}
)


def _unescape(field_: str) -> str:
    """A mountinfo path field (spaces, tabs, newlines and backslashes are octal-escaped)."""
    if "\\" not in field_:
        return field_
    out, i = [], 0
    while i < len(field_):
        if field_[i] == "\\" and field_[i + 1 : i + 4].isdigit():
            out.append(chr(int(field_[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field_[i])
            i += 1
    return "".join(out)


def mount_problem(mountinfo: str, root: str) -> str | None:
    """Why the workspace ``root`` cannot be journaled in the mount namespace whose
    ``/proc/<pid>/mountinfo`` is ``mountinfo``: a mount at or under it, or its
    filesystem not local; None when it can."""
    best, fstype = "", ""
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        parts = left.split()
        if len(parts) < 5 or not right:
            continue
        point = _unescape(parts[4])
        if point == root or point.startswith(root.rstrip("/") + "/"):
            return f"a filesystem is mounted at {point!r}, inside the workspace"
        inside = point == "/" or root == point or root.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, right.split()[0]
    if fstype not in LOCAL_FILESYSTEMS:
        return f"the workspace is on {fstype or 'an unknown'} filesystem, not a local one"
    return None
