"""Failpoints: named places on a call's path where a driver can be made to die.

Product code calls ``hit("name")`` right after the step the name describes (DBOS's
habit: failpoints live in the product, armed from outside). Unarmed, a hit is one dict
lookup. Armed by ``DS_FAILPOINTS="name:n[:action][,...]"`` (or ``arm()``), the n-th hit
of ``name`` in this process acts on the spot:

- ``kill`` (the default): SIGKILL, no cleanup, no flush, exactly what a crash does;
- ``pause``: SIGSTOP of the whole process (every thread, the heartbeat too), what a GC
  pause, a frozen VM or a closed laptop lid does. Whoever continues it (SIGCONT) sees it
  carry on from the very next instruction, with whatever it believed before the pause:
  the fault a kill can never produce, since the paused driver outlives its takeover.

``DS_FAILPOINT_TRACE=FILE`` appends every hit to FILE so a campaign can enumerate the
points a run passes through.
"""

from __future__ import annotations

import os
import signal
import threading

ACTIONS = ("kill", "pause")

_lock = threading.Lock()
_armed: dict[str, tuple[int, str]] = {}
_counts: dict[str, int] = {}
_trace_path: str | None = None


def _parse(spec: str) -> dict[str, tuple[int, str]]:
    armed: dict[str, tuple[int, str]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, rest = part.partition(":")
        nth, _, action = rest.partition(":")
        action = action or "kill"
        if action not in ACTIONS:
            raise ValueError(f"failpoint {name!r}: unknown action {action!r} (want {ACTIONS})")
        armed[name] = (int(nth or "1"), action)
    return armed


def arm(
    spec: str | dict[str, int] | dict[str, tuple[int, str]] | None = None,
    trace: str | None = None,
) -> None:
    """(Re)arm from a spec string/dict, or from the environment when ``spec`` is None."""
    global _trace_path
    with _lock:
        if spec is None:
            spec = os.environ.get("DS_FAILPOINTS", "")
            trace = trace or os.environ.get("DS_FAILPOINT_TRACE") or None
        _armed.clear()
        if isinstance(spec, str):
            _armed.update(_parse(spec))
        else:
            for k, v in spec.items():
                _armed[k] = (v, "kill") if isinstance(v, int) else v
        _counts.clear()
        _trace_path = trace


def hit(point: str) -> None:
    """Mark that execution passed ``point``; act here (die or pause) if this is the armed
    hit."""
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
        armed = _armed.get(point)
        if armed is None or armed[0] != n:
            return
        action = armed[1]
    # Outside the lock: a paused process must not hold it when it is continued late.
    # Directed at this thread: a process-directed SIGSTOP sent from a worker thread lets
    # that thread run on for a moment (it is not the one chosen to take the signal), which
    # would let the step after the failpoint happen before the pause.
    signal.pthread_kill(
        threading.get_ident(), signal.SIGSTOP if action == "pause" else signal.SIGKILL
    )


def counts() -> dict[str, int]:
    """Hits so far in this process (for tests)."""
    with _lock:
        return dict(_counts)


arm()
