"""The harness's state directory on powerfs: for the ``power`` fault, and for kill points
inside the harness's own state writes (``--at state``).

The run's ``{state_dir}`` (where a recipe tells its harness to keep its durable log) is a
powerfs mount (``durable_spaces/chaos/powerfs``) over a backing directory beside it: the
harness sees its writes at once, but only what it made durable (an ``fsync`` of the file,
of the directory for a new name) is in the backing directory. Under ``power``, at the kill
point the lab kills everything the run started, then cuts the power: every unsynced write
and directory entry of the state directory is dropped, and the mount comes back on the
durable state, where the resumed harness finds its log. The workspace is not on the mount
(its effects are what the checker counts, as under the other faults).

The mount also counts the harness's state operations (``chaos/powerfs/trap.py``: each
write, fsync and rename, in order): the uninterrupted run's are the kill points
``write@n``, ``fsync@n`` and ``rename@n``, and a planned run holds its n-th operation of
that kind before it is made (``arm``); the lab kills there (``fault``, runner.py), and
fails the held operation for a caller the kill reached (it dies as the call returns), lets
it go for one it did not (a process outside the killed group), or cuts the power, which
ends it with everything unsynced.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_spaces.campaigns.capabilities import CAPABILITIES
from durable_spaces.chaos.powerfs import PowerFS, PowerFSError, mount
from durable_spaces.probe.gates import GatePoint

__all__ = ["StateDisk", "kill_pending", "power_unavailable"]

_SIGKILL_BIT = 1 << 8  # signal 9 in /proc/<pid>/status's masks


def power_unavailable() -> str | None:
    """Why this machine cannot make the power fault (one line), or None."""
    why = CAPABILITIES["fuse"].missing()
    return None if why is None else f"the power fault needs powerfs: {why}"


def kill_pending(pid: int) -> bool:
    """``pid`` has a SIGKILL pending, or is gone: the kill reached it."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigPnd", "ShdPnd") and int(value.strip() or "0", 16) & _SIGKILL_BIT:
            return True
        if key == "State" and value.strip().startswith(("Z", "X")):
            return True
    return False


class StateDisk:
    """One run's state directory on powerfs; ``cut()`` is the power loss."""

    def __init__(self, state: Path, backing: Path, seed: str) -> None:
        backing.mkdir(parents=True, exist_ok=True)
        self.fs: PowerFS | None = mount(backing, state, seed=seed)
        self.cuts: list[dict[str, Any]] = []
        self.hit: dict[str, Any] | None = None  # the operation a state point held
        self._fifo: Path | None = None

    def cut(self) -> dict[str, Any]:
        """Drop the state directory's unsynced writes; what was dropped."""
        assert self.fs is not None
        r = self.fs.cut()
        out = {"ops": r.ops, "bytes": r.bytes, "inodes": r.inodes}
        self.cuts.append(out)
        return out

    def arm(self, point: GatePoint, fifo: Path, reached: Callable[[GatePoint], None]) -> None:
        """Hold the harness's ``point.step``-th operation of kind ``point.where``; call
        ``reached`` once it is held (from a thread of ours that waits on ``fifo``)."""
        assert self.fs is not None
        os.mkfifo(fifo, 0o600)
        self._fifo = fifo

        def wait() -> None:
            try:
                with open(fifo, encoding="utf-8", errors="replace") as f:
                    line = f.readline()
            except OSError:
                return
            kind, n, pid, path = [*line.rstrip("\n").split(" ", 3), "", "", ""][:4]
            if kind != point.where or not n.isdigit() or not pid.isdigit():
                return  # a cancelled wait (our own writer) or nothing: never reached
            self.hit = {"op": kind, "n": int(n), "pid": int(pid), "path": path[:4096]}
            reached(point)

        threading.Thread(target=wait, name=f"state-{point}", daemon=True).start()
        self.fs.trap(arm=[point.where, point.step], notify=str(fifo))

    def release(self) -> None:
        """Let the held operation go on, or fail it when the kill reached its caller."""
        if self.fs is None or self.hit is None:
            return
        self.fs.trap(release="fail" if kill_pending(self.hit["pid"]) else "go")

    def disarm(self) -> None:
        """The point was never reached: stop our wait (and the mount's hold, if armed)."""
        fifo, self._fifo = self._fifo, None
        if fifo is None:
            return
        with contextlib.suppress(OSError):  # a writer of ours ends our reader's wait
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"never\n")
            os.close(fd)
        with contextlib.suppress(OSError):
            fifo.unlink()

    def ops(self) -> list[tuple[str, int, str, float]]:
        """The harness's state operations so far: (kind, n, path, monotonic time)."""
        assert self.fs is not None
        trace = self.fs.trap(trace=True).get("trace") or []
        return [(str(k), int(n), str(p), float(t)) for k, n, p, _pid, t in trace if int(n)]

    def close(self) -> None:
        """Unmount (what is volatile then no longer matters: the run is over)."""
        fs, self.fs = self.fs, None
        if fs is not None:
            with contextlib.suppress(PowerFSError):
                fs.unmount(sync=False)
