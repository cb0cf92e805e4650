"""The ``cua`` SDK's embedded runtime, one per state dir, and what a daemon must support.

Apart from the Space (``spacesd_space.py``) because a warm driver starts the runtime before it
has a Space (``start_runtime``), and the backend checks a daemon's capabilities before it
makes one (``check_exec_ledger``).
"""

from __future__ import annotations

import threading
from typing import Any

import cua

from durable_spaces.errors import CapabilityMissingError
from durable_spaces.space import EXEC_LEDGER

__all__ = ["check_exec_ledger", "runtime", "start_runtime"]


def check_exec_ledger(caps: Any) -> None:
    """Refuse a daemon that does not report ``process.exec_ledger`` as supported.

    ``caps`` is a ``cua.SpacesdCapabilities`` (or anything with ``features`` of objects
    with ``name`` and ``supported``)."""
    for f in caps.features:
        if f.name == EXEC_LEDGER and f.supported:
            return
    version = getattr(caps, "version", "?")
    raise CapabilityMissingError(
        f"cua-spacesd {version} does not report {EXEC_LEDGER!r}: without an exec ledger "
        "commands could run twice after a crash; use a daemon that has it"
    )


_runtimes: dict[str | None, Any] = {}
_starting = threading.Lock()


def runtime(sdk_home: str | None) -> Any:
    """One SDK runtime per state dir, shared by the Spaces that use it (each runtime has
    its own threads; one per Space would grow with the number of Spaces). Thread-safe:
    a warm-up may start it in a thread while the event loop asks for it."""
    rt = _runtimes.get(sdk_home)
    if rt is None:
        with _starting:
            rt = _runtimes.get(sdk_home)
            if rt is None:
                rt = _runtimes[sdk_home] = cua.embedded(state_dir=sdk_home, spaces_home=sdk_home)
    return rt


def start_runtime(sdk_home: str) -> None:
    """Start the SDK runtime of ``sdk_home`` ahead of the first call (a warm driver
    before its launch); it connects to nothing and writes nothing."""
    runtime(sdk_home)
