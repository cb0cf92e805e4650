"""``inotify_simple``'s ``INotify`` and ``flags``, its libc found without ``ldconfig``.

Why: its first ``INotify`` looks libc up with ``ctypes.util.find_library``, which runs
``ldconfig -p`` in a subprocess (a fork and exec of a process as big as a driver),
paid by every driver's first checkpoint. libc is already in this process, so
it is opened by its soname here; where that name does not load (not glibc), the
library's own lookup stays.
"""

from __future__ import annotations

import contextlib
import ctypes

import inotify_simple
from inotify_simple import INotify, flags

__all__ = ["INotify", "flags"]

if getattr(inotify_simple, "_libc", "absent") is None:
    with contextlib.suppress(OSError):  # else its own lookup on first use
        inotify_simple._libc = ctypes.CDLL("libc.so.6", use_errno=True)
