"""Failpoints: named places on a call's path where a driver can be made to die.

Product code calls ``hit("name")`` right after the step the name describes (DBOS's
habit: failpoints live in the product, armed from outside). Unarmed, a hit is one dict
lookup. Armed by ``DS_FAILPOINTS="name:n[,name:n...]"`` (or ``arm()``), the n-th hit of
``name`` in this process SIGKILLs the process on the spot: no cleanup, no flush, exactly
what a crash does. ``DS_FAILPOINT_TRACE=FILE`` appends every hit to FILE so a campaign
can enumerate the points a run passes through.
"""

from __future__ import annotations

import os
import signal
import threading

_lock = threading.Lock()
_armed: dict[str, int] = {}
_counts: dict[str, int] = {}
_trace_path: str | None = None


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, nth = part.partition(":")
        armed[name] = int(nth or "1")
    return armed


def arm(spec: str | dict[str, int] | None = None, trace: str | None = None) -> None:
    """(Re)arm from a spec string/dict, or from the environment when ``spec`` is None."""
    global _trace_path
    with _lock:
        if spec is None:
            spec = os.environ.get("DS_FAILPOINTS", "")
            trace = trace or os.environ.get("DS_FAILPOINT_TRACE") or None
        _armed.clear()
        _armed.update(_parse(spec) if isinstance(spec, str) else spec)
        _counts.clear()
        _trace_path = trace


def hit(point: str) -> None:
    """Mark that execution passed ``point``; die here if this is the armed hit."""
    if not _armed and _trace_path is None:
        return
    with _lock:
        n = _counts.get(point, 0) + 1
        _counts[point] = n
        if _trace_path is not None:
            with open(_trace_path, "a") as f:
                f.write(f"{point} {n}\n")
                f.flush()
                os.fsync(f.fileno())
        if _armed.get(point) == n:
            os.kill(os.getpid(), signal.SIGKILL)


def counts() -> dict[str, int]:
    """Hits so far in this process (for tests)."""
    with _lock:
        return dict(_counts)


arm()
