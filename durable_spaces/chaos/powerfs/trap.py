"""Crash points inside a program's own writes: the mount counts the state operations it
serves (``write``: a write, a truncate, an O_TRUNC open, a fallocate; ``fsync``: fsync,
fdatasync, a directory's fsync; ``rename``), keeps their trace, and can hold the n-th
operation of one kind before it is made, so a lab kills the program there (and may cut the
power) with exactly the operations before it made. ALICE and CrashMonkey explore such crash
states for file systems; the probe (durable_spaces/probe/) explores them for an agent
harness's journal.

A held operation is announced on a FIFO the lab names (one line: ``kind n pid path``, the
path in the mount), then waits until the lab releases it: ``go`` makes it, ``fail`` makes
it fail with EIO, unmade (for a caller the lab has killed: it dies as the call returns and
never sees the error). A cut during a hold ends it like any request in flight. The hold is
taken before the operation's lock (ops.PowerOps.mutex), so other processes' operations and
a cut go on. Operations the kernel sends on its own (page cache writeback of a shared
mapping, whose caller is no process: pid 0) are traced but neither counted nor held: they
come when the kernel pleases, not where the program is.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from typing import Any

from durable_spaces.chaos.powerfs.disk import tgid
from durable_spaces.errors import ConfigError

__all__ = ["KINDS", "MAX_TRACE", "Trap"]

KINDS = ("write", "fsync", "rename")
#: The most operations a trace keeps (later ones are counted, not traced).
MAX_TRACE = 100_000


class Trap:
    """One boot's count of state operations, their trace, and the armed hold."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.counts = dict.fromkeys(KINDS, 0)
        self.trace: list[tuple[str, int, str, int, float]] = []  # kind, n, path, pid, t
        self.armed: tuple[str, int] | None = None
        self.notify = ""
        self.held: dict[str, Any] | None = None  # the operation held now
        self.verdict = ""

    def op(self, kind: str, path: str, tid: int) -> None:
        """Called by a FUSE thread before it makes operation ``kind`` on ``path`` for
        thread ``tid``: count it, trace it, hold it when it is the armed one."""
        pid = tgid(tid) if tid else 0
        with self._cond:
            if not pid:
                n = 0
            else:
                self.counts[kind] += 1
                n = self.counts[kind]
            if len(self.trace) < MAX_TRACE:
                self.trace.append((kind, n, path, pid, time.monotonic()))
            if not n or self.armed != (kind, n):
                return
            self.armed = None
            self.held = {"op": kind, "n": n, "path": path, "pid": pid}
            self.verdict = ""
            notify = self.notify
        try:
            fd = os.open(notify, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # nobody listens: the lab gave up on this point; go on
            with self._cond:
                self.held = None
            return
        try:
            os.write(fd, f"{kind} {n} {pid} {path}\n".encode())
        finally:
            os.close(fd)
        with self._cond:
            while not self.verdict:
                self._cond.wait()
            verdict, self.held = self.verdict, None
        if verdict == "fail":
            raise OSError(errno.EIO, "the lab failed a held operation (powerfs trap)")

    def command(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The control socket's ``trap`` command: ``arm`` ([kind, n]) with ``notify`` (a
        FIFO's path), ``release`` (``go`` or ``fail``), and always the state (with the
        trace when ``trace`` is true)."""
        with self._cond:
            if "arm" in msg:
                kind, n = _point(msg["arm"])
                notify = msg.get("notify")
                if not isinstance(notify, str) or not notify.startswith("/"):
                    raise ConfigError(f"powerfs trap: notify must be an absolute path: {notify!r}")
                self.armed, self.notify = (kind, n), notify
            if "release" in msg:
                if msg["release"] not in ("go", "fail"):
                    raise ConfigError(f"powerfs trap: release go or fail, not {msg['release']!r}")
                if self.held is not None:
                    self.verdict = msg["release"]
                    self._cond.notify_all()
            out: dict[str, Any] = {"counts": dict(self.counts), "held": self.held,
                                   "armed": list(self.armed) if self.armed else None}  # fmt: skip
            if msg.get("trace"):
                out["trace"] = [list(t) for t in self.trace]
            return out


def _point(value: Any) -> tuple[str, int]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or value[0] not in KINDS
        or isinstance(value[1], bool)
        or not isinstance(value[1], int)
        or value[1] < 1
    ):
        raise ConfigError(f"powerfs trap: arm takes [kind, n >= 1], kind one of {KINDS}")
    return value[0], value[1]
