"""A container's workspace as this host sees it: through the container's root
filesystem, mounted here by the engine (overlay2's ``MergedDir``), so that its scans run
here, kept by the host's change journal (``spacesd.host_scan``), instead of two
commands through the daemon per scan.

Why it is the same directory: the engine mounts the container's root filesystem at
``MergedDir`` and the container's mount namespace holds that same mount, so a file has
one inode either way (the same ``st_dev`` and ``st_ino`` from both sides) and inotify,
whose watches are on inodes, reports here every change a command makes there (checked:
``tests/backends/test_docker_host_view.py``).

What could make the two differ, and what is done about each:

- The agent owns ``/home/cua``: it may swap the workspace for a symlink (``/`` here is
  this host's root, there the container's) or a directory elsewhere. The workspace is
  opened one component at a time, never following a link and never leaving the
  filesystem of ``MergedDir``, and held by that descriptor (the scans' root is
  ``/proc/self/fd/<n>``, the directory opened, whatever its path becomes); a swap after
  that is seen by the journal's guard (``moved``: the path's directory is not the one
  held), and the next full scan opens the path again: a link refuses it, and the scan
  goes through the daemon.
- A mount inside the workspace in the container's namespace (invisible here): the
  container's mount table is watched with the host's (``journal._Mounts``), at the
  workspace's path there.
- A restart of the container (a new mount of its root filesystem) or of its daemon: the
  journal's guard is the daemon's boot id (``ContainerProbe.boot_id``).
- A storage driver without ``MergedDir``, a remote engine, a ``MergedDir`` this process
  cannot open: no host view, the daemon scans (``merged_dir`` returns None).

Only reads happen here; every change of the workspace still goes through the daemon,
fenced by its epoch.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import threading
from typing import Any

__all__ = ["WorkspaceView", "merged_dir", "open_beneath"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def merged_dir(container: Any) -> str | None:
    """The host path of ``container``'s root filesystem (a Docker SDK container, fresh
    ``attrs``), or None when this host cannot see it."""
    try:
        driver = container.attrs.get("GraphDriver") or {}
        merged = (driver.get("Data") or {}).get("MergedDir")
    except AttributeError:
        return None
    if not isinstance(merged, str) or not os.path.isabs(merged):
        return None
    return merged if os.path.isdir(merged) else None


def open_beneath(top: str, inside: str) -> int:
    """The directory ``inside`` (an absolute path in the container) under ``top``, opened
    one component at a time without following a link or leaving ``top``'s filesystem;
    ``OSError`` when it cannot be (a link: ``ELOOP``; another mount: ``EXDEV``)."""
    fd = os.open(top, _DIR)
    try:
        dev = os.fstat(fd).st_dev
        for part in [p for p in inside.split("/") if p]:
            sub = _step(fd, part, dev, inside)
            os.close(fd)
            fd = sub
        return fd
    except BaseException:
        os.close(fd)
        raise


def _step(fd: int, part: str, dev: int, inside: str) -> int:
    """The directory ``part`` of ``fd``, not a link, on filesystem ``dev``."""
    if part in (".", ".."):
        raise OSError(22, f"not a plain path: {inside!r}")
    sub = os.open(part, _DIR | os.O_NOFOLLOW, dir_fd=fd)
    if os.fstat(sub).st_dev != dev:
        os.close(sub)
        raise OSError(18, f"{inside!r} crosses into another filesystem here")
    return sub


class WorkspaceView:
    """The workspace ``inside`` of a container whose root filesystem is at ``merged``,
    held open (``resolve``: opened again, for each full scan)."""

    def __init__(self, merged: str, inside: str) -> None:
        self.merged = merged
        self.inside = inside.rstrip("/") or "/"
        self._fd: int | None = None
        self._parent: int | None = None  # the workspace's directory, opened with it
        self._lock = threading.Lock()

    def resolve(self) -> str:
        """The workspace opened now (module doc), as a path to its descriptor."""
        parent = open_beneath(self.merged, posixpath.dirname(self.inside))
        try:  # the workspace as a child of the directory held with it
            name = posixpath.basename(self.inside)
            fd = _step(parent, name, os.fstat(parent).st_dev, self.inside)
        except BaseException:
            os.close(parent)
            raise
        self._hold(fd, parent)
        return f"/proc/self/fd/{fd}"

    def beside(self, directory: str) -> tuple[str, tuple[int, int]] | None:
        """Where this host reaches ``directory``, a sibling of the workspace in the
        container (a checkpoint's copy), through the directory opened with it, and the
        workspace's owner (uid, gid), whom what is made there must belong to; None when
        it is not a plain sibling or nothing is open."""
        name = posixpath.basename(directory.rstrip("/"))
        if posixpath.dirname(directory.rstrip("/")) != posixpath.dirname(self.inside):
            return None
        if name in ("", ".", "..") or "/" in name:
            return None
        with self._lock:
            fd, parent = self._fd, self._parent
        if fd is None or parent is None:
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        return f"/proc/self/fd/{parent}/{name}", (st.st_uid, st.st_gid)

    def moved(self) -> str | None:
        """Why the directory at the workspace's path is not the one held (swapped,
        removed, never opened), or None. The journal asks before it vouches for anything:
        a directory moved or removed on an overlay filesystem does not always tell its
        own watch (a ``mv`` of a directory from the image's layer is a copy and a
        removal), and the scans' root, a descriptor, would go on reading the old one."""
        with self._lock:
            fd = self._fd
        if fd is None:
            return "the workspace was not opened here"
        try:
            held = os.fstat(fd)
            now = os.lstat(os.path.join(self.merged, self.inside.lstrip("/")))
        except OSError as e:
            return f"the workspace is gone from its path: {e.strerror}"
        if (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino):
            return "the workspace's path names another directory now"
        return None

    def close(self) -> None:
        self._hold(None, None)

    def _hold(self, fd: int | None, parent: int | None) -> None:
        """Hold these descriptors from now on, and close the ones held before."""
        with self._lock:
            old = (self._fd, self._parent)
            self._fd, self._parent = fd, parent
        for o in old:
            if o is not None:
                with contextlib.suppress(OSError):
                    os.close(o)
