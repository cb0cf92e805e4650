"""A cgroup v2 this process made: a set of processes that is killed whole.

Why: a process group or a session is a container its members can leave (``setsid``,
``setpgid``), and an environment marker is one they can clear (``env -i``). A cgroup is
not: a process cannot move itself out of it without write access to the hierarchy's
other directories, and its children are born in it. Killing a cgroup (``cgroup.kill``,
Linux 5.14+; else freeze it, SIGKILL every member, thaw) reaches everything that was
started in it, whatever it did to its group, session or environment.

Used by local Spaces (one cgroup per epoch, killed at an advance) and by the lab (a
probe's "machine" fault: everything a run started). Where the host has no writable
cgroup v2 hierarchy, ``unavailable()`` says why and callers say so in their capabilities.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
from pathlib import Path

from durable_spaces.errors import ConfigError

__all__ = ["Cgroup", "cgroup_root", "unavailable"]

#: Where this package's cgroups live under the hierarchy's root.
PARENT = "durable-spaces"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}")


def _mount_point(mountinfo: str) -> Path | None:
    """The cgroup2 mount of this mount namespace (``/proc/self/mountinfo``), if any."""
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            parts = left.split()
            if len(parts) >= 5:
                return Path(parts[4])
    return None


def cgroup_root() -> Path | None:
    """The directory under which this package makes its cgroups: the cgroup of this
    process on the v2 hierarchy, or the hierarchy's root when that is where we are."""
    try:
        mount = _mount_point(Path("/proc/self/mountinfo").read_text())
        own = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    if mount is None:
        return None
    rel = "/"
    for line in own.splitlines():
        if line.startswith("0::"):
            rel = line[3:].strip() or "/"
    return mount / rel.lstrip("/") / PARENT


def unavailable(root: Path | None = None) -> str | None:
    """None when cgroups can be made and killed under ``root`` (``cgroup_root()`` when
    not given); else the reason, in one line."""
    root = cgroup_root() if root is None else root
    if root is None:
        return "no cgroup v2 hierarchy is mounted (/proc/self/mountinfo has no cgroup2)"
    try:
        root.mkdir(exist_ok=True)
    except OSError as e:
        return f"cannot make a cgroup under {root.parent}: {e.strerror or e}"
    probe = root / f"probe-{os.getpid()}"
    try:
        probe.mkdir(exist_ok=True)
        ok = (probe / "cgroup.procs").exists()
    except OSError as e:
        return f"cannot make a cgroup under {root}: {e.strerror or e}"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return None if ok else f"{root} has no cgroup.procs: not a cgroup v2 directory"


class Cgroup:
    """One cgroup directory under ``cgroup_root()``, named by its maker."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str) -> Cgroup:
        """Make (or reuse) the cgroup ``name``; ``ConfigError`` if this host cannot."""
        if not _NAME.fullmatch(name):
            raise ConfigError(f"cgroup name {name!r}: letters, digits, '_', '.', '-' only")
        why = unavailable()
        root = cgroup_root()
        if why is not None or root is None:
            raise ConfigError(f"no cgroup for {name}: {why}")
        path = root / name
        path.mkdir(exist_ok=True)
        return cls(path)

    def add(self, pid: int) -> None:
        """Move ``pid`` (and so its future children) into this cgroup."""
        (self.path / "cgroup.procs").write_text(f"{int(pid)}\n")

    def pids(self) -> list[int]:
        """The processes in this cgroup now (none when it is gone)."""
        try:
            text = (self.path / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        except OSError as e:  # ENODEV: removed between open and read
            if e.errno == errno.ENODEV:
                return []
            raise
        return [int(x) for x in text.split()]

    def populated(self) -> bool:
        try:
            events = (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False
        except OSError as e:  # ENODEV: removed between open and read (so it was empty)
            if e.errno == errno.ENODEV:
                return False
            raise
        return "populated 1" in events

    def kill(self, wait_s: float = 10.0) -> bool:
        """SIGKILL every process in the cgroup and wait until it is empty (at most
        ``wait_s``). True when it is empty."""
        kill_file = self.path / "cgroup.kill"
        try:
            if kill_file.exists():
                kill_file.write_text("1\n")
            else:
                self._freeze_and_kill()
        except FileNotFoundError:
            return True
        deadline = time.monotonic() + wait_s
        while self.populated():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _freeze_and_kill(self) -> None:
        freeze = self.path / "cgroup.freeze"
        if freeze.exists():
            freeze.write_text("1\n")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if freeze.exists():
            freeze.write_text("0\n")

    def remove(self) -> None:
        """Kill what is left and remove the directory and the cgroups below it (a local
        Space started from inside this one nests its epochs' cgroups here:
        ``backends/local/cgroups.py``); a no-op when it is gone."""
        self.kill()
        _rmdir_tree(self.path)


def _rmdir_tree(path: Path) -> None:
    """Remove an emptied cgroup, deepest first."""
    try:
        subs = [p for p in path.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return
    for sub in subs:
        _rmdir_tree(sub)
    try:
        path.rmdir()
    except OSError as e:
        if e.errno not in (errno.ENOENT,):
            raise
