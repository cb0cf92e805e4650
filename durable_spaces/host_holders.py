"""Which files of one filesystem some process on this host holds open or maps shared.

Why: a store through a shared writable ``mmap`` changes a file with no inotify event
and, while its page stays dirty, without moving the file's mtime either: neither a
change journal nor a stat key sees it. Such a store needs the file held: mapped shared
(``/proc/<pid>/maps``), or, once unmapped, still open (``/proc/<pid>/fd``; a mapping
keeps its file open, so its last close comes after every store and is an event of its
own: ``IN_CLOSE_WRITE``). A file no process holds cannot change silently, so a
checkpoint reads again exactly the held files whose stat key and events say nothing.

What it cannot see: processes blind to it from the start (``Holders``), processes
outside this host's view of ``/proc`` (another PID
namespace's parent, another machine sharing the filesystem), and descriptors in flight
in a Unix socket while nobody holds them; such a holder is seen once it holds the file
at a later look, or by its close's event.
"""

from __future__ import annotations

import os

__all__ = ["Holders"]


class Holders:
    """The holders of files on device ``dev`` (the filesystem of a workspace), looked at
    again on each ``now``.

    A process whose ``/proc`` entries cannot be read (another user's without the
    privilege; one outside this user namespace, such as a sandbox's own PID 1) is blind
    to the look. Those blind when the object is made (the journal's start) are taken to
    hold nothing of the workspace, the same trust their descriptor writes get from the
    journal's events; a process that turns blind later (a command that made itself
    undumpable, another user's process started since) makes ``now`` None: nothing is
    trusted. A process is known by its pid and start time, so a reused pid is new.
    """

    def __init__(self, dev: int) -> None:
        self.dev = dev
        self._blind: frozenset[tuple[str, bytes]] = frozenset()
        first = self._look()
        self.problem: str | None = None if first is not None else "cannot list /proc"
        if first is not None:
            self._blind = frozenset(first[1])

    def now(self) -> set[int] | None:
        """Inode numbers on ``dev`` some process holds open or maps shared (where the
        mapping's file cannot be looked up, its inode number on any device: a
        superset); None when a process that was not blind at the start is now."""
        look = self._look()
        if look is None:
            return None
        held, blind = look
        if not blind <= self._blind:
            return None
        return held

    def _look(self) -> tuple[set[int], set[tuple[str, bytes]]] | None:
        held: set[int] = set()
        blind: set[tuple[str, bytes]] = set()
        try:
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return None
        for pid in pids:
            try:
                _fds(pid, self.dev, held)
                _maps(pid, self.dev, held)
            except (FileNotFoundError, ProcessLookupError):
                continue  # it exited: its files were closed, each close an event
            except PermissionError:
                blind.add((pid, _started(pid)))
        return held, blind


def _started(pid: str) -> bytes:
    """The start time of ``pid`` (field 22 of its stat, after the parenthesised name)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return b""
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[19] if len(fields) > 19 else b""


def _fds(pid: str, dev: int, held: set[int]) -> None:
    with os.scandir(f"/proc/{pid}/fd") as it:
        for e in it:
            try:
                s = os.stat(e.path)  # the magic link: the open file itself
            except (FileNotFoundError, NotADirectoryError):
                continue  # closed meanwhile
            if s.st_dev == dev:
                held.add(s.st_ino)


def _maps(pid: str, dev: int, held: set[int]) -> None:
    with open(f"/proc/{pid}/maps", "rb") as f:
        data = f.read()
    for line in data.splitlines():
        fields = line.split(maxsplit=5)
        # address perms offset dev inode [path]; "s" in perms: a shared mapping (even
        # one mprotect-ed read-only now may have been written before).
        if len(fields) < 5 or fields[1][3:4] != b"s" or fields[4] == b"0":
            continue
        ino = int(fields[4])
        try:
            # The mapping's file as a path sees it (overlay, btrfs subvolumes: the
            # dev of maps is the backing superblock's, not the one ``stat`` reports).
            s = os.stat(f"/proc/{pid}/map_files/{fields[0].decode()}")
        except PermissionError:
            held.add(ino)  # cannot tell the device: any file with this number
            continue
        except OSError:
            continue  # unmapped meanwhile: its file's close (or fd) says the rest
        if s.st_dev == dev:
            held.add(s.st_ino)
