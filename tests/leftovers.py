"""The session-end check: a test run leaves no process behind (``tests/conftest.py``).

Every process a test starts (a daemon, a driver, a fork server, a probe's harness, a
PostgreSQL server, a QEMU guest, a command of a Space) is found at the end of the run in
one of two ways, and the run fails naming each, after killing it:

- the session's cgroup: the pytest process that starts the run (the xdist controller, or
  the only process) moves itself into a cgroup v2 of its own before any worker starts, so
  everything started under it is born there or below (a local Space's epochs nest their
  cgroups under the caller's: ``durable_spaces/host/cgroup.py``), however it left its
  session, its group or its environment. What another daemon starts on request (a
  container of dockerd) is not ours and not there.
- the session's mark, where the host has no cgroup v2 to make: ``DS_TEST_SESSION=<token>``
  in the environment of every process that inherited it (a process that clears its
  environment is then not found).

A run killed before its end (a ``timeout``) cannot check itself: the next run kills and
removes what its cgroup still holds when it starts.

By the time the check runs, pytest has torn down every fixture and xdist its workers; the
check waits for those workers' exit (an event: their pidfd), never for a time.

One kind is ended without failing the run: a local Space's fork server
(``durable_spaces/backends/local/forkserver.py``, marked ``DS_LOCAL_SERVER``) outlives
its drivers by design and retires by itself after its idle time (or once its Space is
gone), so a test that leaves its Spaces leaves one for that long; its commands, if any
still run, are leftovers like any other process.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path

from durable_spaces.host.cgroup import cgroup_root

#: The environment mark of a test session's processes.
MARK = "DS_TEST_SESSION"


#: The mark of a process that retires by itself (``forkserver.py``'s ``MARK``).
RETIRES = b"DS_LOCAL_SERVER="


@dataclass
class Leftover:
    pid: int
    cmdline: str
    retires: bool = False


class Session:
    """One test run's processes: its cgroup (None where it cannot be made) and its mark."""

    def __init__(self, token: str, cgroup: Path | None, home: Path | None) -> None:
        self.token = token
        self.cgroup = cgroup
        self._home = home  # where this process was before it moved into ``cgroup``

    @classmethod
    def start(cls) -> Session:
        token = uuid.uuid4().hex
        os.environ[MARK] = token
        root = cgroup_root()  # <this process's cgroup>/durable-spaces
        if root is None:
            return cls(token, None, None)
        home, cgroup = root.parent, root.parent / f"ds-tests-{os.getpid()}-{token[:8]}"
        _sweep_dead_runs(home)
        try:
            cgroup.mkdir()
            (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
        except OSError:
            with contextlib.suppress(OSError):
                cgroup.rmdir()
            return cls(token, None, None)
        return cls(token, cgroup, home)

    def _in_cgroup(self) -> set[int]:
        if self.cgroup is None:
            return set()
        pids: set[int] = set()
        for d in [self.cgroup, *(p for p in self.cgroup.rglob("*") if p.is_dir())]:
            with contextlib.suppress(OSError):
                pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
        return pids

    def _marked(self) -> set[int]:
        needle = f"{MARK}={self.token}".encode()
        pids = set()
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError):
                    if needle in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                        pids.add(int(name))
        return pids

    def leftovers(self, workers: list[int]) -> list[Leftover]:
        """The processes of the session still alive, but this one, once ``workers`` (the
        xdist workers, torn down) have exited; zombies (exited, not yet reaped) do not
        count."""
        for pid in workers:
            _wait_exit(pid)
        me = os.getpid()
        out = []
        for pid in sorted((self._in_cgroup() | self._marked()) - {me, *workers}):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                if stat.rpartition(")")[2].split()[0] == "Z":
                    continue
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue  # gone meanwhile
            cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
            out.append(Leftover(pid, cmdline, any(v.startswith(RETIRES) for v in env)))
        return out

    def end(self, left: list[Leftover]) -> None:
        """Kill ``left`` (whole cgroup: ``cgroup.kill``), move back home, remove the
        session's cgroups."""
        for p in left:
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGKILL)
        if self.cgroup is None or self._home is None:
            return
        with contextlib.suppress(OSError):
            (self._home / "cgroup.procs").write_text(f"{os.getpid()}\n")
        with contextlib.suppress(OSError):
            (self.cgroup / "cgroup.kill").write_text("1\n")
        _wait_empty(self.cgroup)
        _remove_tree(self.cgroup)


def _sweep_dead_runs(home: Path) -> None:
    """The cgroups of earlier runs whose first process is gone (a run killed before its
    end, as by a ``timeout``): what they still hold is killed, and they are removed. A
    run whose process lives (another run beside this one) is left alone."""
    for d in home.glob("ds-tests-*-*"):
        try:
            pid = int(d.name.split("-")[2])
        except ValueError:
            continue
        if Path(f"/proc/{pid}").exists():
            continue
        with contextlib.suppress(OSError):
            (d / "cgroup.kill").write_text("1\n")
        _wait_empty(d)
        _remove_tree(d)


def _remove_tree(cgroup: Path) -> None:
    """Remove an emptied cgroup and those below it, deepest first."""
    below = [p for p in cgroup.rglob("*") if p.is_dir()]
    for d in sorted([cgroup, *below], key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()


def _wait_exit(pid: int) -> None:
    """Until ``pid`` has exited (its pidfd reads ready); at once when it is gone."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def _wait_empty(cgroup: Path) -> None:
    """Until ``cgroup.events`` says ``populated 0`` (the kernel wakes a poll at each
    change)."""
    try:
        fd = os.open(cgroup / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            os.lseek(fd, 0, os.SEEK_SET)
            if b"populated 0" in os.read(fd, 4096):
                return
            poller.poll()
    except OSError:
        return  # removed: it was empty
    finally:
        os.close(fd)


def report(left: list[Leftover]) -> str:
    lines = [f"{len(left)} process(es) a test started still ran at the end of the run:"]
    lines += [f"  {p.pid}: {p.cmdline[:200]}" for p in left]
    return "\n".join(lines)


def failing(left: list[Leftover]) -> list[Leftover]:
    """What fails the run: every leftover but those that retire by themselves."""
    return [p for p in left if not p.retires]
