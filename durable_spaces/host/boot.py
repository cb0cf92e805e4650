"""The boot id of the host a Space's state lives on: what tells a host crash apart.

A power loss keeps only what was synced, of the log and of the Space alike, and fails
nothing afterwards: the daemon (or the ``local`` stand-in's directory) answers as before.
Only the host's boot id shows it happened. A Space whose state is on this host reports
it through ``host_boot_id()`` (the optional ``HostBoot`` protocol); the adapter compares
it with the one its log last committed with (``adapter/machine.py``).

``DS_HOST_BOOT_ID`` names a file to read it from instead of the kernel's: the lab's host
that can lose power rewrites that file when it boots again (``campaigns/power.py``).
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

#: The kernel's boot id (a new random uuid at every boot).
KERNEL_BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: The environment variable naming the file to read the boot id from instead.
BOOT_ENV = "DS_HOST_BOOT_ID"
_MAX = 128


@runtime_checkable
class HostBoot(Protocol):
    """A Space whose state is on this host and says which boot of it is running."""

    async def host_boot_id(self) -> str | None: ...


@runtime_checkable
class MachineBoot(Protocol):
    """A Space that can read its machine's boot id through a process it already runs
    there (``spacesd/guest_journal.py``'s helper), without starting a command: None when
    it runs none (then the id is read by a command, ``adapter/machine.py``)."""

    async def machine_boot_id(self) -> str | None: ...


def read_host_boot_id(path: str | os.PathLike[str] | None = None) -> str | None:
    """This host's boot id (the file ``path``: ``Settings.host_boot_id``, from
    ``DS_HOST_BOOT_ID``; else the kernel's); None when it cannot be read. Only a short
    printable word is taken (it is compared, never a path)."""
    path = path or KERNEL_BOOT_ID
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX + 1)
    except OSError:
        return None
    text = raw.decode("ascii", "replace").strip()
    if not text or len(text) > _MAX or not text.isprintable() or " " in text:
        return None
    return text


__all__ = ["BOOT_ENV", "KERNEL_BOOT_ID", "HostBoot", "read_host_boot_id"]
