"""The processes of one run, and the faults that kill them.

Every attempt (a launch or a resume) starts in a session of its own (its own process
group) and, where the host has cgroup v2 (host/cgroup.py), inside the run's cgroup: a
small ``sh`` moves itself there and ``exec``s the harness, so everything the harness
starts, even a process that leaves its session, is born in it.

Faults: ``process`` is a SIGKILL of the attempt's process group, a crash of the agent
process: whatever escaped the group (``setsid``) keeps running and its late effects are
seen. ``machine`` is a SIGKILL of everything the run started (the cgroup), a host crash.
``power`` kills as ``machine`` does (without cgroups, every process carrying the run's
token), and then drops the unsynced writes of the harness's state directory (power.py).
At the end of a run the cgroup is killed and removed, so nothing is left running; without
cgroups the lab finds the run's processes by the ``PROBE_RUN_TOKEN`` in their environment
(a process could clear it, which is why the cgroup is preferred and ``machine`` needs it).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from durable_spaces.host.cgroup import Cgroup, cgroup_root, unavailable

__all__ = [
    "CANNOT_START", "KILL_FAULTS", "MODEL_FAULTS", "WHOLE_RUN", "HarnessProcess", "RunProcs",
    "machine_unavailable", "sweep",
]  # fmt: skip

KILL_FAULTS = ("process", "machine", "power")
#: The faults that reach everything the run started, not only the attempt.
WHOLE_RUN = ("machine", "power")
MODEL_FAULTS = ("model-5xx", "model-cut", "model-slow")
#: Of an attempt's output, the lab keeps the first and the last this many bytes.
KEEP_BYTES = 8 << 10
_WRAP = 'echo $$ > "$1" && shift && exec "$@"'
#: How a shell says its command cannot start: not found, not executable.
CANNOT_START = (126, 127)


def machine_unavailable() -> str | None:
    why = unavailable()
    return None if why is None else f"the machine fault needs a cgroup v2: {why}"


class HarnessProcess:
    """One started harness process, its capped output and its exit."""

    def __init__(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str],
                 cgroup: Cgroup | None) -> None:  # fmt: skip
        self.argv = list(argv)
        full = list(argv)
        if cgroup is not None:
            full = ["/bin/sh", "-c", _WRAP, "probe", str(cgroup.path / "cgroup.procs"), *argv]
        self.started = time.monotonic()
        self.ended: float | None = None
        self.head = b""
        self.tail = b""
        self.total = 0
        self.proc = subprocess.Popen(
            full, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.pgid = self.proc.pid
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout as f:
            while chunk := f.read1(65536):  # type: ignore[attr-defined]
                self.total += len(chunk)
                if len(self.head) < KEEP_BYTES:
                    take = KEEP_BYTES - len(self.head)
                    self.head += chunk[:take]
                    chunk = chunk[take:]
                self.tail = (self.tail + chunk)[-KEEP_BYTES:]

    def wait(self) -> int:
        rc = self.proc.wait()
        if self.ended is None:
            self.ended = time.monotonic()
        return rc

    def output(self) -> str:
        """What it printed (stdout and stderr), its middle left out past the cap."""
        self._reader.join(timeout=1.0)  # a grandchild may hold the pipe open
        cut = self.total - len(self.head) - len(self.tail)
        gap = f"\n[... {cut} bytes left out ...]\n".encode() if cut > 0 else b""
        return (self.head + gap + self.tail).decode("utf-8", "replace")

    def last_line(self) -> str:
        lines = [x.strip() for x in self.output().splitlines() if x.strip()]
        return lines[-1][:300] if lines else ""

    @property
    def duration_s(self) -> float:
        return (self.ended or time.monotonic()) - self.started


def _members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[2] == str(pgid):
            out.append(int(d))
    return out


def _marked(token: str) -> list[int]:
    """The processes whose environment holds ``PROBE_RUN_TOKEN=token``."""
    needle = f"PROBE_RUN_TOKEN={token}".encode()
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                    out.append(int(d))
    return out


def _kill_and_wait(cgroup: Cgroup, limit_ms: int = 10_000,
                   between: Callable[[], None] | None = None) -> None:  # fmt: skip
    """SIGKILL the cgroup's processes and wait until it is empty, woken by the kernel's
    notice on ``cgroup.events`` (Cgroup.kill polls it every few milliseconds); ``between``
    runs after the signal and before the wait (a process held inside a filesystem call
    dies only once the call returns)."""
    events = cgroup.path / "cgroup.events"
    try:
        (cgroup.path / "cgroup.kill").write_text("1\n")
        fd = os.open(events, os.O_RDONLY)
    except OSError:  # no cgroup.kill (before Linux 5.14): freeze and kill, polling
        if between is not None:
            between()
        cgroup.kill()
        return
    if between is not None:
        between()
    try:
        p = select.poll()
        p.register(fd, select.POLLPRI)
        deadline = time.monotonic() + limit_ms / 1000
        while cgroup.populated() and time.monotonic() < deadline:
            p.poll(50)
    finally:
        os.close(fd)


def sweep(prefix: str) -> int:
    """Kill and remove every run cgroup whose name starts with ``prefix``; how many."""
    root = cgroup_root()
    if root is None or not root.is_dir():
        return 0
    n = 0
    for d in root.glob(f"{prefix}*"):
        with contextlib.suppress(OSError):
            cg = Cgroup(d)
            _kill_and_wait(cg)
            cg.remove()
            n += 1
    return n


class RunProcs:
    """Everything one run starts: its attempts, in one cgroup where the host has them."""

    def __init__(self, name: str, token: str, use_cgroup: bool) -> None:
        self.token = token
        self.cgroup: Cgroup | None = None
        root = cgroup_root() if use_cgroup else None
        if root is not None:  # the probe asked unavailable() once, before its runs
            (root / name).mkdir()
            self.cgroup = Cgroup(root / name)
        self.attempts: list[HarnessProcess] = []

    def start(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> HarnessProcess:
        a = HarnessProcess(argv, cwd, {**env, "PROBE_RUN_TOKEN": self.token}, self.cgroup)
        self.attempts.append(a)
        return a

    def kill(self, fault: str, attempt: HarnessProcess,
             between: Callable[[], None] | None = None) -> None:  # fmt: skip
        """The fault: the attempt's process group, or everything the run started;
        ``between`` runs once the signal is sent, before the lab waits for the dead."""
        if fault in WHOLE_RUN and self.cgroup is not None:
            _kill_and_wait(self.cgroup, between=between)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(attempt.pgid, signal.SIGKILL)
        left = _marked(self.token) if fault == "power" else []
        for pid in left:  # no cgroup: the run's processes by its token, until gone
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if between is not None:
            between()
        if fault == "power":
            deadline = time.monotonic() + 10
            while any(self.alive(p) for p in left) and time.monotonic() < deadline:
                time.sleep(0.002)

    def stop_all_but(self, fault: str, attempt: HarnessProcess, keep: int) -> None:
        """SIGSTOP what the kill will reach, except ``keep`` (a command about to exit):
        the harness then cannot see that command's exit before the kill."""
        cg = self.cgroup if fault in WHOLE_RUN else None
        pids = cg.pids() if cg is not None else _members(attempt.pgid)
        for pid in pids:
            if pid != keep:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)

    def alive(self, pid: int) -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]

    def close(self) -> None:
        """Kill whatever of the run is still running; nothing is left."""
        for a in self.attempts:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(a.pgid, signal.SIGKILL)
        if self.cgroup is not None:
            _kill_and_wait(self.cgroup)
            self.cgroup.remove()
        else:
            for pid in _marked(self.token):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for a in self.attempts:
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.proc.wait(timeout=10)
