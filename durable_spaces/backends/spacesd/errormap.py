"""What a daemon-backed Space makes of the cua SDK's errors.

An SDK error is one of four things, and a caller must never confuse them: a stale epoch
(``StaleEpochError``), a daemon that is down or a Space that is gone (asked of the
backend's ``DaemonProbe``, which knows the machine without asking the daemon), the
``OSError`` a file operation would raise, or a request the daemon refused. None of them
is ever a command's failure. The Space's token is scrubbed from every message.
"""

from __future__ import annotations

import errno
import re
from typing import Protocol

import cua

from durable_spaces.errors import (
    SpaceError,
    SpaceGoneError,
    SpaceUnavailableError,
    StaleEpochError,
)

_STALE = re.compile(r"epoch (\d+) is older than the Space's current epoch (\d+)")


class DaemonProbe(Protocol):
    """What the backend knows about its daemon without asking it."""

    def boot_id(self) -> str | None:
        """Identity of the running daemon (changes on each start); None when it is down."""
        ...

    def gone(self) -> bool:
        """The Space was deleted (or replaced by a new instance under its name)."""
        ...


class ErrorMap:
    """Maps SDK errors of Space ``name`` (see the module doc); holds its ``probe``."""

    def __init__(self, name: str, token: str, probe: DaemonProbe) -> None:
        self.name = name
        self.probe = probe
        self._token = token

    def scrub(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    def down(self, what: str) -> SpaceUnavailableError:
        """The Space is unavailable because of ``what`` (gone, when the probe says so)."""
        if self.probe.gone():
            return SpaceGoneError(f"Space {self.name!r} no longer exists ({what})")
        return SpaceUnavailableError(f"Space {self.name!r} is unavailable: {what}")

    def map(self, e: BaseException) -> BaseException:
        """An SDK error as one of ours: a stale epoch, a down or deleted Space, or the
        ``OSError`` a file operation would raise. Never a command failure."""
        msg = self.scrub(str(e))
        m = _STALE.search(msg)
        if m:
            return StaleEpochError(int(m.group(1)), int(m.group(2)), "space")
        E = cua.CuaError
        if not isinstance(e, E) or isinstance(
            e,
            (
                E.Transport,
                E.SpacesdNotAvailable,
                E.Timeout,
                E.Closed,
                E.Unauthenticated,
                E.DaemonNotRunning,
                E.Cancelled,
            ),
        ):
            return self.down(msg)
        if any(t in msg for t in ("(Cancelled)", "(Unavailable)", "operation was canceled")):
            return self.down(msg)  # an RPC cut by the daemon going away (gRPC status)
        if isinstance(e, E.NotFound):
            if "process not found" in msg:
                return self.down(msg)
            return FileNotFoundError(errno.ENOENT, msg)
        if isinstance(e, E.PermissionDenied):
            return PermissionError(errno.EACCES, msg)
        low = msg.lower()
        if "not a directory" in low:
            return NotADirectoryError(errno.ENOTDIR, msg)
        if "is a directory" in low:
            return IsADirectoryError(errno.EISDIR, msg)
        if "directory not empty" in low:
            return OSError(errno.ENOTEMPTY, msg)
        if self.probe.gone():
            return SpaceGoneError(f"Space {self.name!r} no longer exists ({msg})")
        return SpaceError(f"cua-spacesd refused the request: {msg}")
