"""Failpoints: named places on a call's path where a driver can be made to die or stop.

Product code calls ``hit("name")`` right after the step the name describes (DBOS's
habit: failpoints live in the product, armed from outside). Unarmed, a hit is one dict
lookup. Armed by ``DS_FAILPOINTS="name:n[:action][,...]"`` (or ``arm()``), the n-th hit
of ``name`` in this process acts on the spot:

- ``kill`` (the default): SIGKILL, no cleanup, no flush, exactly what a crash does;
- ``pause``: SIGSTOP of the whole process (every thread, the heartbeat too), what a GC
  pause, a frozen VM or a closed laptop lid does. Whoever continues it (SIGCONT) sees it
  carry on from the very next instruction, with whatever it believed before the pause:
  the fault a kill can never produce, since the paused driver outlives its takeover;
- ``stop``: the same SIGSTOP, as a rendezvous: the lab sees the driver stopped exactly
  here, inflicts whatever the schedule places at this point (a daemon kill, a machine
  restart, a removal, a kill of the driver itself), then continues it. This is what
  makes a fault's position in the run data, not a wall-clock accident.

A name may be armed several times (``a:1:stop,a:3``). The name ``*`` counts every
*logical* hit: all hits except the timer-driven ones (``hit(..., timer=True)``: a command
still running 50 ms after it started), whose happening depends on how fast a command
ran, so ``*:7:stop`` is "after the 7th logical hit" and two runs of one schedule count
the same. ``DS_FAILPOINT_TRACE=FILE`` appends every hit as
``point n g call t`` (``g``: the logical index, ``-`` for a timer point; ``call``: the
wrapped call in progress as ``tool:call_id``, ``-`` outside one; ``t``: CLOCK_MONOTONIC in
microseconds, one clock for every process of the host) so a campaign can enumerate the
points a run passes through, record where a fault landed, and draw each attempt's calls
on a timeline. Readers take the first three fields and ignore what follows.
"""

from __future__ import annotations

import contextvars
import os
import re
import signal
import threading
import time
from collections.abc import Mapping

ACTIONS = ("kill", "pause", "stop")
ANY = "*"

_lock = threading.Lock()
_armed: dict[str, dict[int, str]] = {}
_counts: dict[str, int] = {}
_logical = 0
_trace_path: str | None = None
_off = False
#: The wrapped call in progress in this task (``tool:call_id``), for the trace only.
_call: contextvars.ContextVar[str] = contextvars.ContextVar("ds_failpoint_call", default="-")
_WORD = re.compile(r"[^A-Za-z0-9_.:@-]")


def in_call(tool: str, call_id: str) -> contextvars.Token[str] | None:
    """Name the tool call this task runs, in trace lines, until ``leave_call``: only
    when a trace is written (else nothing is set)."""
    if _trace_path is None:
        return None
    return _call.set(_WORD.sub("_", f"{tool}:{call_id}")[:200])


def leave_call(token: contextvars.Token[str] | None) -> None:
    if token is not None:
        _call.reset(token)


def parse(spec: str) -> dict[str, dict[int, str]]:
    """``name:n[:action]`` items, comma-separated (``ValueError`` names a bad one)."""
    armed: dict[str, dict[int, str]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, rest = part.partition(":")
        nth, _, action = rest.partition(":")
        action = action or "kill"
        if not name:
            raise ValueError(f"failpoint spec {part!r} has no name")
        if action not in ACTIONS:
            raise ValueError(f"failpoint {name!r}: unknown action {action!r} (want {ACTIONS})")
        try:
            n = int(nth or "1")
        except ValueError:
            raise ValueError(f"failpoint {name!r}: hit number {nth!r} is not an integer") from None
        if n < 1:
            raise ValueError(f"failpoint {name!r}: hit number must be >= 1, not {n}")
        armed.setdefault(name, {})[n] = action
    return armed


def arm(
    spec: str | dict[str, int] | dict[str, tuple[int, str]] | None = None,
    trace: str | None = None,
) -> None:
    """(Re)arm from a spec string/dict, or from the environment when ``spec`` is None."""
    global _trace_path, _logical, _off
    with _lock:
        # The mutant ``failpoints_off`` (chaos/mutants.py), read here from the variable
        # itself: this module is also loaded alone, outside the package, by the local
        # fork server (backends/local/forkserver.py), so it imports nothing of it.
        _off = "failpoints_off" in os.environ.get("DS_MUTANTS", "").replace(" ", "").split(",")
        if spec is None:
            spec = os.environ.get("DS_FAILPOINTS", "")
            trace = trace or os.environ.get("DS_FAILPOINT_TRACE") or None
        _armed.clear()
        if isinstance(spec, str):
            _armed.update(parse(spec))
        else:
            for k, v in spec.items():
                n, action = (v, "kill") if isinstance(v, int) else v
                _armed.setdefault(k, {})[n] = action
        _counts.clear()
        _logical = 0
        _trace_path = trace


def trace_of(env: Mapping[str, str]) -> str | None:
    """The trace file a process started with ``env`` writes (its ``DS_FAILPOINT_TRACE``,
    which the lab sets per launch), or None."""
    return env.get("DS_FAILPOINT_TRACE") or None


def hit(point: str, *, timer: bool = False) -> None:
    """Mark that execution passed ``point``; act here (die or stop) if this is an armed
    hit of it (or of ``*``). ``timer``: hit from a timer, not a logical position."""
    global _logical
    if not _armed and _trace_path is None:
        return
    if _off:
        return
    with _lock:
        n = _counts.get(point, 0) + 1
        _counts[point] = n
        g = None
        if not timer:
            _logical += 1
            g = _logical
        if _trace_path is not None:
            # Flushed, not fsynced: the lab reads it on this host (the page cache outlives
            # the process), and a trace is lab data, kept off any power-loss mount.
            with open(_trace_path, "a") as f:
                f.write(
                    f"{point} {n} {'-' if g is None else g} {_call.get()} "
                    f"{time.monotonic_ns() // 1000}\n"
                )
        action = _armed.get(point, {}).get(n)
        if action is None and g is not None:
            action = _armed.get(ANY, {}).get(g)
        if action is None:
            return
    # Outside the lock: a paused process must not hold it when it is continued late.
    # Directed at this thread: a process-directed SIGSTOP sent from a worker thread lets
    # that thread run on for a moment (it is not the one chosen to take the signal), which
    # would let the step after the failpoint happen before the pause.
    sig = signal.SIGKILL if action == "kill" else signal.SIGSTOP
    signal.pthread_kill(threading.get_ident(), sig)


def counts() -> dict[str, int]:
    """Hits so far in this process (for tests)."""
    with _lock:
        return dict(_counts)


arm()
