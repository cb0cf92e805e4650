"""The disk's timing: a latency on every durability call, and stalls (a disk that stops
completing them for a while), for the lab's slow-disk faults.

What is delayed or held is exactly the durability calls (``fsync``, ``fdatasync``, a
directory ``fsync``, a write to an ``O_SYNC``/``O_DSYNC`` file): a plain ``write`` lands in
the page cache, which a stalled disk does not stop from taking writes (a short stall is
far from the kernel's dirty-page limits). A held call waits *before* it takes the ops'
mutation lock (``ops.PowerOps.mutex``), so reads, writes and other processes' metadata
changes go on, and a cut (which takes that lock) is never kept waiting by a stall.

A stall ``stall(seconds)`` holds every durability call that arrives (or is already being
delayed) until it ends: at its deadline, or at ``resume()``. ``resume(keep_stuck=True)``
models requests the disk lost: the disk serves new calls again, but those it was holding
stay stuck until the stall's deadline or a later ``resume()`` (a SCSI/NVMe command whose
completion never came, retried only at its timeout). ``fail(pids)`` fails the calls held
for those processes (EIO, nothing synced): a lab's power loss kills the processes stuck
in the disk first, and they die as their call returns instead of waiting for the stall.
A held call's caller cannot be killed meanwhile (the kernel waits uninterruptibly once a
FUSE request was read), as on a real disk (state ``D``). A cut during a stall ends it:
the held calls fail like any request in flight at a cut (ECONNABORTED) and what they
were making durable is lost; the next boot's disk is not stalled. A latency is the
disk's: the supervisor sets it again on every boot. libfuse serves at most 10 requests
at once: more than ~10 held calls at one moment would keep every other request waiting
too.
"""

from __future__ import annotations

import errno
import math
import threading
import time
from typing import Any

from durable_spaces.errors import ConfigError

#: The longest stall and the largest latency accepted (a lab's fault, not an outage).
MAX_STALL_S = 600.0
MAX_LATENCY_MS = 10_000.0


def seconds(value: Any, what: str, upper: float) -> float:
    """``value`` as a finite number in ``[0, upper]``; ``ConfigError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"powerfs {what} must be a number, not {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or v > upper:
        raise ConfigError(f"powerfs {what} must be between 0 and {upper:g}, not {value!r}")
    return v


def tgid(tid: int) -> int:
    """The process of a calling thread (FUSE reports the thread's id)."""
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return tid


class Disk:
    """One boot's disk timing, shared by the FUSE threads and the control thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.latency_ms = 0.0
        self._until = 0.0  # monotonic deadline of the current stall
        self._serving = True  # new calls pass (no stall, or resumed keeping the stuck)
        self._gen = 0  # stalls so far; a held call belongs to the stall it arrived in
        self._released = 0  # stalls up to this one released by resume()
        self._held: dict[int, tuple[int, str]] = {}  # thread id -> (its process, the path)
        self._failing: set[int] = set()  # held threads whose call is to fail (fail())
        self.counters = {"stalls": 0, "held_calls": 0, "delayed_calls": 0}

    def _stalled(self, gen: int, now: float) -> bool:
        return gen > self._released and now < self._until

    def durability_call(self, tid: int, path: str = "") -> None:
        """Called by a FUSE thread before it makes ``path`` durable for thread ``tid``:
        wait the latency, then for as long as a stall holds the call."""
        with self._cond:
            delay = self.latency_ms / 1000
            if delay:
                self.counters["delayed_calls"] += 1
        if delay:
            time.sleep(delay)
        with self._cond:
            if self._serving or not self._stalled(self._gen, time.monotonic()):
                return
            gen, me = self._gen, threading.get_ident()
            self._held[me] = (tgid(tid), path)
            self.counters["held_calls"] += 1
            try:
                while me not in self._failing and self._stalled(gen, now := time.monotonic()):
                    self._cond.wait(self._until - now)
            finally:
                del self._held[me]
            if me in self._failing:
                self._failing.discard(me)
                raise OSError(errno.EIO, "the disk failed a held call (powerfs disk.fail)")

    def stall(self, secs: Any) -> dict[str, Any]:
        """Hold every durability call for ``secs`` seconds from now (0 ends a stall)."""
        s = seconds(secs, "stall seconds", MAX_STALL_S)
        if s == 0:
            return self.resume(keep_stuck=False)
        with self._cond:
            if self._serving or not self._stalled(self._gen, time.monotonic()):
                self._gen += 1
                self.counters["stalls"] += 1
            self._serving = False
            self._until = time.monotonic() + s
            self._cond.notify_all()
        return self.state()

    def resume(self, *, keep_stuck: bool) -> dict[str, Any]:
        """End the stall: every held call goes on, or (``keep_stuck``) only new ones do."""
        with self._cond:
            self._serving = True
            if not keep_stuck:
                self._released = self._gen
            self._cond.notify_all()
        return self.state()

    def fail(self, pids: Any) -> dict[str, Any]:
        """The calls held for processes ``pids`` fail (EIO) now, unsynced. For a lab that
        has SIGKILLed those processes before a power loss: they die as the call returns,
        never seeing it, and what the calls were making durable is lost with the cut."""
        if not isinstance(pids, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in pids
        ):
            raise ConfigError(f"powerfs fail takes a list of process ids, not {pids!r}")
        with self._cond:
            for thread, (pid, _) in self._held.items():
                if pid in pids:
                    self._failing.add(thread)
            self._cond.notify_all()
        return self.state()

    def latency(self, ms: Any) -> dict[str, Any]:
        """Delay each durability call by ``ms`` milliseconds (0: none)."""
        v = seconds(ms, "fsync latency ms", MAX_LATENCY_MS)
        with self._cond:
            self.latency_ms = v
        return self.state()

    def state(self) -> dict[str, Any]:
        with self._cond:
            now = time.monotonic()
            stalled = not self._serving and self._stalled(self._gen, now)
            return {
                "stalled": stalled,
                "stall_left_s": round(max(0.0, self._until - now), 3) if stalled else 0.0,
                "held": len(self._held),
                "held_pids": sorted({pid for pid, _ in self._held.values()}),
                "held_paths": sorted({path for _, path in self._held.values()}),
                "fsync_ms": self.latency_ms,
                **self.counters,
            }


__all__ = ["MAX_LATENCY_MS", "MAX_STALL_S", "Disk", "seconds", "tgid"]
