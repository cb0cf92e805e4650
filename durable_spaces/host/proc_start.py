"""When a process started, as a part of its identity: seconds since this host booted.

A pid is reused, so a process is known by its pid *and* its start. psutil's
``create_time()`` gives the start on the wall clock: the start since boot plus the boot
time of ``/proc/stat`` (``btime``), which is the wall clock's idea of when the host
booted and moves whenever the clock is stepped (a virtual machine restored from a
snapshot, an NTP step), by whole seconds. A process recorded before such a step then no
longer matched itself: a running command read ``lost``, a container's daemon read as
restarted (its boot id was built from the start), a stray QEMU as gone. The start since
boot (field 22 of ``/proc/<pid>/stat``, in clock ticks) never moves. Values recorded by
an older version (wall-clock seconds) never match one of these: such a process reads as
another one, as after a restart of the host.
"""

from __future__ import annotations

import os

import psutil

__all__ = ["started"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def started(pid: int) -> float:
    """Seconds from this host's boot to the start of process ``pid`` (``psutil.NoSuchProcess``
    when there is none)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19]) / _TICKS  # field 22; the first two are before ")"
    except (IndexError, ValueError):
        raise psutil.NoSuchProcess(pid) from None
