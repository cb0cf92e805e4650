"""The client side of a microvm Space: the spacesd backend's Space, plus what a VM adds.

``SpacesdSpace`` already speaks to any cua-spacesd; here it gets a ``DaemonProbe`` read
from the Space's state file, the Space's user (``cua``), and two things of the VM:

- the epoch floor has a host copy (``SpaceState.floor``) beside the guest's, because the
  guest's rolls back with every restore: ``current_epoch`` is the higher of the two, and
  ``advance_epoch`` raises both under the Space's lock, so a restore (which replaces the
  machine) is wholly before or after an advance, never around it;
- with the backend's ``sweep_orphans``, a rising floor also sweeps the guest of processes
  the current daemon does not own (the sweep hook), as docker does. Off by default: a
  process an agent left running is machine state that checkpoints keep.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Protocol

import cua

from durable_spaces.backends.microvm import qemu
from durable_spaces.backends.microvm.guest import WORKSPACE
from durable_spaces.backends.microvm.state import MicrovmState, StateFiles
from durable_spaces.backends.spacesd.machine import orphan_sweep_script
from durable_spaces.backends.spacesd.spacesd_space import SpacesdSpace, SweepWhen
from durable_spaces.errors import SpaceError
from durable_spaces.settings import Settings
from durable_spaces.space import Capabilities

USER = "cua"
#: Where the guest's daemon reads its token (``--await-token-file``).
TOKEN_PATH = "/run/cua/env-token"
#: The guest's daemon writes its pid here (``/sbin/cua-init``).
DAEMON_PID = "/run/cua/daemon.pid"

# Kills, as root in the guest, every process that is neither pid 1 nor under the current
# daemon: what remains of a killed daemon's commands, and background leftovers.
_SWEEP = orphan_sweep_script(f"cat {DAEMON_PID} 2>/dev/null")


class MicrovmHost(Protocol):
    """What a microvm Space asks of its backend (``MicrovmBackend``)."""

    files: StateFiles
    #: Read at each advance: a caller may switch it on a living backend.
    sweep_orphans: bool
    #: The product's settings (``durable_spaces/settings.py``).
    settings: Settings

    def sdk_home(self) -> str:
        """The cua SDK's state for this backend (its sandbox registry), not ~/.cua."""
        ...


class VmProbe:
    """``DaemonProbe`` of one Space instance, read from its state file (cheap: it is asked
    around every output event)."""

    def __init__(self, files: StateFiles, name: str, instance_id: str) -> None:
        self._files = files
        self._name = name
        self._instance = instance_id

    def boot_id(self) -> str | None:
        st = self._files.read(self._name)
        if st is None or st.instance_id != self._instance:
            return None
        if not qemu.alive(st.pid, st.pid_start):
            return None
        return f"{st.pid}:{st.boot}"

    def gone(self) -> bool:
        st = self._files.read(self._name)
        return st is None or st.instance_id != self._instance


class MicrovmSpace(SpacesdSpace):
    """A cua-spacesd Space inside a QEMU guest, reached on its forwarded port."""

    def __init__(self, host: MicrovmHost, name: str, st: MicrovmState, token: str) -> None:
        super().__init__(
            name,
            WORKSPACE,
            st.instance_id,
            f"http://127.0.0.1:{st.port}",
            token,
            VmProbe(host.files, name, st.instance_id),
            kind="microvm",
            user=USER,
            sdk_home=host.sdk_home(),
            settings=host.settings,
        )
        self._host = host
        self.port = st.port

    def __repr__(self) -> str:  # never shows the token
        return f"MicrovmSpace({self.name!r}, port={self.port})"

    async def capabilities(self) -> Capabilities:
        caps = await super().capabilities()
        return dataclasses.replace(caps, kind="microvm", machine_checkpoints=True)

    async def root_run(
        self, script: str, *args: str, timeout: float | None = None
    ) -> tuple[int | None, bytes]:
        """A ledger-less shell script as root in the guest (not fenced). A ``timeout``
        bounds it: a daemon going away under a call must not hang a backend operation."""
        cmd = cua.SpacesdCommand(program="sh", args=["-c", script, "sh", *args], cwd="/", epoch=0)
        out = await asyncio.wait_for(self._call("run", cmd), timeout)
        code = out.exit.code if out.exit is not None else None
        return code, bytes(out.stdout or b"") + bytes(out.stderr or b"")

    async def current_epoch(self) -> int:
        st = self._host.files.read(self.name)
        host = st.floor if st is not None and st.instance_id == self.instance_id else 0
        return max(host, await super().current_epoch())

    async def advance_epoch(self, epoch: int) -> None:
        async with self._host.files.lock(self.name):
            self._host.files.raise_floor(self.name, self.instance_id, epoch)
            await self.advance_guest(epoch)

    async def advance_guest(self, epoch: int) -> None:
        """The guest's half of ``advance_epoch`` (the caller holds the Space's lock and
        has raised the host floor)."""
        await super().advance_epoch(epoch)

    def _sweep_when(self) -> SweepWhen:
        return "rise" if self._host.sweep_orphans else "never"

    async def _sweep_strays(self) -> None:
        code, out = await self.root_run(_SWEEP)
        if code not in (0, None):
            raise SpaceError(repr(out[-200:]))
