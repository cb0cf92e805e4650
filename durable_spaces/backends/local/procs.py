"""The processes of a ``local`` Space, which stand in for its machine: telling one of ours
from a reused pid, killing them all (or those of older epochs), and reaping the
supervisors this process started.

A process is the Space's when it is a recorded supervisor (pid and create time in its
``cmds/<id>/meta.json``) or in one's tree, or when its environment carries the Space's
mark (``DS_SPACE=<instance>``, with ``DS_EPOCH``); its fork server (``forkserver.py``)
carries ``DS_LOCAL_SERVER=<instance>`` instead, and dies only with the whole machine
(restart, delete), never by an epoch. A process that both leaves the group
and clears its environment escapes these: the Space's cgroups (``cgroups.py``) catch it
where the host has them, and the Space's capabilities say when it does not. Liveness is
psutil with the create time, so a reused pid is not mistaken for ours, and a zombie
counts as dead (pid 1 of these machines does not reap orphans).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil

from durable_spaces.backends.local.disk import read_json
from durable_spaces.backends.local.forkserver import MARK
from durable_spaces.errors import SpaceUnavailableError
from durable_spaces.host.proc_start import started

#: How long the processes of a Space may take to die of SIGKILL.
KILL_TIMEOUT = 10.0

#: Supervisors this process started, kept so they are reaped (and never warned about).
_children: set[subprocess.Popen[bytes]] = set()
_children_lock = threading.Lock()


def track(p: subprocess.Popen[bytes]) -> None:
    """Keep a supervisor this process started, to reap it."""
    with _children_lock:
        _children.add(p)


def reap() -> None:
    with _children_lock:
        for p in [p for p in _children if p.poll() is not None]:
            _children.discard(p)


def alive(pid: int, ctime: float) -> bool:
    """Whether ``pid`` still is the process created at ``ctime`` (and not a zombie)."""
    try:
        p = psutil.Process(pid)
        if abs(started(pid) - ctime) > 0.01:
            return False  # the pid was reused
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def dead(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return True
    except psutil.AccessDenied:
        return False


def space_procs(d: Path, instance: str) -> list[psutil.Process]:
    """Every live process of the Space: recorded supervisors with their trees, and any
    process carrying the Space's mark."""
    procs: dict[int, psutil.Process] = {}
    for meta_path in (d / "cmds").glob("*/meta.json"):
        meta = read_json(meta_path)
        if meta is None or not alive(meta["pid"], meta["ctime"]):
            continue
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(meta["pid"])
            for q in [p, *p.children(recursive=True)]:
                procs[q.pid] = q
    for p in carrying(instance):
        with contextlib.suppress(psutil.Error):
            if p.environ().get("DS_SPACE") == instance:
                procs[p.pid] = p
    return list(procs.values())


def carrying(instance: str) -> list[psutil.Process]:
    """The processes (not this one) whose environment names ``instance`` anywhere: a
    superset of those marked with it, each to be checked by its parsed environment.

    Why not ``psutil.process_iter``: it makes a ``Process`` of every pid, with a read of
    its ``stat``, to then read every environment, and an epoch raise (a driver's start)
    paid that for every process of the host, most of them kernel threads
    (docs/performance.md). The raw ``/proc/<pid>/environ`` says at once that a process
    has nothing of the Space; only the few that do become a ``Process`` (whose create time then
    guards the kill against a reused pid, as before)."""
    needle = instance.encode()
    me = os.getpid()
    found: list[psutil.Process] = []
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return [p for p in psutil.process_iter() if p.pid != me]
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read():
                    continue
        except OSError:
            continue  # gone, or unreadable: as its ``environ()`` would be (skipped)
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


def kill_space(d: Path, instance: str, below_epoch: int | None = None) -> None:
    """SIGKILL the Space's processes (those of an epoch below ``below_epoch`` if given)
    and wait until they are dead: recorded process groups, then anything carrying the
    Space's mark in its environment."""
    procs: list[psutil.Process] = []

    def take(p: psutil.Process) -> None:
        with contextlib.suppress(psutil.Error):
            procs.extend([p, *p.children(recursive=True)])

    for meta_path in (d / "cmds").glob("*/meta.json"):
        meta = read_json(meta_path)
        if meta is None or (meta_path.parent / "status").exists():
            continue
        if below_epoch is not None and meta["epoch"] >= below_epoch:
            continue
        if alive(meta["pid"], meta["ctime"]):
            take(psutil.Process(meta["pid"]))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(meta["pid"], signal.SIGKILL)  # the supervisor leads its group
    for p in carrying(instance):
        try:
            env = p.environ()
        except psutil.Error:
            continue
        if env.get("DS_SPACE") != instance:
            # The fork server (and its children before their command): the machine's own
            # process, of no epoch, so only a restart or removal kills it.
            if below_epoch is None and env.get(MARK) == instance:
                take(p)
            continue
        if below_epoch is not None:
            try:
                if int(env.get("DS_EPOCH", "")) >= below_epoch:
                    continue
            except ValueError:
                pass  # marked as ours with an unreadable epoch: older than any
        take(p)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    deadline = time.monotonic() + KILL_TIMEOUT
    while not all(dead(p) for p in procs):
        if time.monotonic() > deadline:
            raise SpaceUnavailableError(f"processes of Space {d.name} survived SIGKILL")
        time.sleep(0.005)
    reap()
