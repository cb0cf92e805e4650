"""The lock of a ``local`` Space: a ``flock`` on its ``lock`` file, held by every section
that reads the epoch floor and acts on it (a spawn, a file change, an advance), so a
stale writer's change lands wholly before a takeover or not at all.

It is held by clients (this stand-in's daemon runs in its callers), and a client frozen
inside a spawn (a paused driver, a driver stopped at a failpoint) would hold a real
machine's restart or removal for as long as it is frozen; the real daemon's restart
waits for no client. So the machine itself (restart, removal) takes it with patience
(``MACHINE_PATIENCE_S``) and goes ahead without it when its holder does not let go in
time. Without the lock a restart only kills and writes a new boot id
(``LocalBackend.restart``): a spawn it overtook finds its supervisor killed (the key
reads ``lost``), or forks after it (the command runs in the new boot), or finds the
Space gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from durable_spaces.errors import SpaceGoneError

#: How long a restart or removal of the Space waits for a client holding its lock
#: before it goes ahead without (module doc).
MACHINE_PATIENCE_S = 2.0


def _flock(fd: int, patience_s: float | None) -> bool:
    """Take the flock on ``fd``: waiting for good, or at most ``patience_s``."""
    if patience_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


@contextlib.contextmanager
def space_lock(
    directory: Path, name: str, check: Callable[[], None], patience_s: float | None = None
) -> Iterator[bool]:
    """The lock of the Space ``name`` in ``directory``; yields whether it was taken
    (always, without ``patience_s``). ``check`` runs once it is held (or given up on):
    the Space must still be its instance."""
    try:
        fd = os.open(directory / "lock", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SpaceGoneError(f"Space {name} no longer exists") from None
    try:
        locked = _flock(fd, patience_s)
        check()
        yield locked
    finally:
        os.close(fd)
