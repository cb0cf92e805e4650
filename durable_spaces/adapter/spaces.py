"""The conversations' Spaces as this driver holds them: names, epochs, capabilities.

A Space is named from ``<namespace>/<conversation id>`` (or bound to a name a
coordinator placed). The first use of a Space in a driver raises its epoch floor to the
session's epoch, which kills every older driver's commands; a new log on a Space already
at exactly that epoch uses one above it (two sessions must never share command keys).
Whether the Space is still the one the log knows is for ``durable.py`` to decide; this
module only finds, creates and fences.
"""

from __future__ import annotations

import asyncio

from durable_spaces.adapter.config import AdapterConfig
from durable_spaces.errors import HaltError, SpaceUnavailableError, StaleEpochError
from durable_spaces.space import Capabilities, Space, space_name

#: What transactional mode (``modes.py``) runs in a Space.
TOOLING = ("find", "stat", "xargs", "sha256sum", "tar")


async def missing_tooling(space: Space, epoch: int) -> str | None:
    """Why the Space lacks ``TOOLING``, or None."""
    script = " && ".join(f"command -v {t} >/dev/null" for t in TOOLING)
    res = await space.exec(["bash", "-c", script], key=None, epoch=epoch, cwd="/")
    if res.exit_code == 0:
        return None
    return f"tooling missing in the Space (needs {', '.join(TOOLING)})"


class SpaceKeeper:
    """The open Spaces of one adapter (one driver)."""

    def __init__(self, config: AdapterConfig) -> None:
        self.config = config
        self.open: dict[str, Space] = {}
        self._bound: dict[str, str] = {}
        self._epochs: dict[str, int] = {}
        self._caps: dict[str, Capabilities] = {}
        self._tooling: dict[str, str | None] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    # --- names ------------------------------------------------------------------------------

    def bind(self, conversation_id: str, name: str) -> None:
        self._bound[conversation_id] = name

    def name_for(self, conversation_id: str) -> str:
        if conversation_id in self._bound:
            return self._bound[conversation_id]
        if self.config.name_for is not None:
            return self.config.name_for(conversation_id)
        ns = self.config.namespace
        return space_name(f"{ns}/{conversation_id}" if ns else conversation_id)

    def lock(self, name: str) -> asyncio.Lock:
        """Wrapped calls run one at a time per Space."""
        return self._locks.setdefault(name, asyncio.Lock())

    # --- what a Space can do -------------------------------------------------------------

    async def capabilities(self, space: Space) -> Capabilities:
        if space.name not in self._caps:
            self._caps[space.name] = await space.capabilities()
        return self._caps[space.name]

    async def tooling(self, space: Space) -> str | None:
        """Why the Space lacks what transactional mode needs (asked once), or None."""
        if space.name not in self._tooling:
            missing = await missing_tooling(space, self.epoch_for(space.name))
            self._tooling[space.name] = missing
        return self._tooling[space.name]

    # --- epochs -------------------------------------------------------------------------

    def epoch_for(self, name: str) -> int:
        return self._epochs.get(name, self.config.epoch)

    def fenced(self, name: str) -> bool:
        """Whether this driver already raised the Space's floor."""
        return name in self._epochs

    def _stale(self, err: StaleEpochError) -> StaleEpochError:
        if self.config.on_stale is not None:
            self.config.on_stale(err)
        return err

    async def raise_epoch_of(self, space: Space, new_log: bool = False) -> None:
        """Advance the Space to this session's epoch (killing older commands)."""
        caps = await self.capabilities(space)
        if not caps.exec_ledger:
            raise HaltError(
                f"Space {space.name} does not report process.exec_ledger", permanent=True
            )
        current = await space.current_epoch()
        target = self.epoch_for(space.name)
        if new_log and current == target and space.name not in self._epochs:
            target += 1  # another log already used this epoch on this Space
        if current > target:
            raise self._stale(StaleEpochError(target, current, "space"))
        try:
            await space.advance_epoch(target)
        except StaleEpochError as e:
            raise self._stale(e) from None
        except (SpaceUnavailableError, OSError) as e:
            raise HaltError(f"cannot raise the epoch of Space {space.name}: {e}") from e
        self._epochs[space.name] = target

    async def raise_epoch(self, name: str) -> None:
        """Raise the epoch of the named Space now, if it exists (the driver's first act)."""
        space = self.open.get(name) or await self.config.spaces.find(name)
        if space is None:
            return
        self.open[name] = space
        await self.raise_epoch_of(space)

    # --- finding ------------------------------------------------------------------------

    async def find_or_create(self, name: str) -> tuple[Space, bool]:
        """The Space (found open, found, or created empty) and whether it was missing."""
        space = self.open.get(name) or await self.config.spaces.find(name)
        if space is not None:
            return space, False
        return await self.config.spaces.create(name), True

    async def space(self, conversation_id: str) -> Space:
        """The conversation's Space as it is now, fenced (for unwrapped tools)."""
        name = self.name_for(conversation_id)
        space, _ = await self.find_or_create(name)
        if not self.fenced(name):
            await self.raise_epoch_of(space)
        self.open[name] = space
        return space
