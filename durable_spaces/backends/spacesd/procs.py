"""Which host processes are a spacesd daemon's (``daemon.py``): a pid's identity (its
start time, so a reused pid is never taken for another), the members of its PID
namespace, of its process tree and of its process group, and the sweep that kills what
in its namespace no tracked command owns."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

from durable_spaces.host.proc_start import started


def start_time(pid: int) -> float | None:
    """Start time of a live (non-zombie) process, else None."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return started(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def alive(pid: int, start: float) -> bool:
    t = start_time(pid) if pid > 0 else None
    return t is not None and abs(t - start) < 0.05


def pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def ns_members(ns: str) -> list[int]:
    out = []
    for pid in psutil.pids():
        if pid_ns(pid) == ns:
            out.append(pid)
    return out


def ns_pid(pid: int) -> int | None:
    """The pid of a host process inside its own (innermost) PID namespace."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def sweep_untracked(daemon_pid: int, tracked: set[int]) -> list[int]:
    """SIGKILL every process in the daemon's PID namespace that no tracked command owns.

    The daemon's ``AdvanceEpoch`` kills the commands it tracks, but a command's background
    children outlive it (``sleep 100 &`` is reparented to pid 1, the daemon) and would
    keep writing after a newer epoch restored the workspace. ``tracked`` holds the
    in-namespace pids of the daemon's running commands (all of the new epoch, after an
    advance); a process is owned when it or an ancestor below the daemon is one of them.
    """
    ns = pid_ns(daemon_pid)
    if ns is None:
        return []
    victims = []
    for pid in ns_members(ns):
        if pid == daemon_pid:
            continue
        owned = False
        try:
            proc: psutil.Process | None = psutil.Process(pid)
            while proc is not None and proc.pid != daemon_pid:
                if ns_pid(proc.pid) in tracked:
                    owned = True
                    break
                proc = proc.parent()
        except psutil.Error:
            continue
        if not owned:
            victims.append(pid)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return victims


def tree(pid: int) -> list[int]:
    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def pgroup_members(pgid: int) -> list[int]:
    out = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                out.append(pid)
        except OSError:
            continue
    return out
