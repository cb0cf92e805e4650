"""A Space's machine that crashed and booted again: seen, and never vouched for.

A machine with its own kernel (a microVM) that was killed and booted again keeps only
what reached its disk: writes of calls whose outcome the log holds may be gone. Such a
restart fails nothing (the daemon comes back and answers), so it is seen only by the
guest kernel's boot id: the log remembers the one it last committed with, a driver
remembers the one it bound to. Two rules follow:

- when a driver binds to a Space whose boot id is not the log's, what the log implies is
  brought back (the newest checkpoint, or the image) and the calls in flight are unknown
  (``durable.py`` does that with the mode's keeper);
- before a commit that vouches for the machine's state (a checkpoint, a scan) the boot
  id is read again, and the driver halts instead of committing a torn disk.

Watched are whole-machine Spaces (``machine_checkpoints``: one exec per commit, or one
request to a helper the Space already runs there, ``host.boot.MachineBoot``) and
Spaces whose state is on the driver's own host (``host.boot.HostBoot``: the ``local``
stand-in, one file read), whose host can lose power and with it the unsynced tail of
the log *and* of the workspace (the Space may then be ahead of the log, or behind it).
"""

from __future__ import annotations

from durable_spaces.adapter.space_state import SpaceState
from durable_spaces.adapter.spaces import SpaceKeeper
from durable_spaces.errors import SpaceUnavailableError
from durable_spaces.host.boot import HostBoot, MachineBoot
from durable_spaces.space import Space

BOOT_ID = "/proc/sys/kernel/random/boot_id"


class BootWatch:
    """The boot ids this driver bound to, per Space."""

    def __init__(self, spaces: SpaceKeeper) -> None:
        self.spaces = spaces
        self._boot: dict[str, str] = {}

    async def read(self, space: Space) -> str | None:
        if isinstance(space, HostBoot):  # its state is on this host: the host's boot id
            return await space.host_boot_id()
        if isinstance(space, MachineBoot):  # read by a process already running there
            boot = await space.machine_boot_id()
            if boot is not None:
                return boot
        res = await space.exec(
            ["cat", BOOT_ID], key=None, epoch=self.spaces.epoch_for(space.name), cwd="/"
        )
        if res.exit_code != 0:
            return None
        return res.output.decode(errors="replace").strip() or None

    async def bind(self, space: Space) -> str | None:
        """Read the boot id and remember it as the one this driver is bound to (after a
        restore of a machine checkpoint it is the checkpoint's)."""
        boot = await self.read(space)
        if boot:
            self._boot[space.name] = boot
        return boot

    @staticmethod
    def reports(space: Space) -> bool:
        """Whether ``space`` says which boot of its host runs without a machine of its own
        (the host's boot id)."""
        return isinstance(space, HostBoot)

    def watched(self, name: str) -> bool:
        return name in self._boot

    def forget(self, name: str) -> None:
        """A new machine under this name: its boot id is learned anew."""
        self._boot.pop(name, None)

    def stamp(self, state: SpaceState) -> None:
        """Write the bound boot id into the state about to be committed."""
        if state.space is not None and state.space in self._boot:
            state.boot = self._boot[state.space]

    async def require_same(self, space: Space) -> None:
        """Halt (``SpaceUnavailableError``) if the machine booted again since this driver
        bound to it: what is about to be committed may be torn."""
        bound = self._boot.get(space.name)
        if bound is None:
            return  # not a whole-machine Space (or its boot id is not known yet)
        now = await self.read(space)
        if now != bound:
            raise SpaceUnavailableError(
                f"the machine of Space {space.name} booted again while this driver ran "
                f"(boot id {bound[:8]} -> {(now or '?')[:8]}): writes that had not reached "
                "its disk are lost"
            )

    async def crashed_since_log(self, space: Space, state: SpaceState) -> bool:
        """Bind to the machine; whether its boot id differs from the one the log saw."""
        boot = await self.bind(space)
        return not (boot is None or state.boot is None or boot == state.boot)
