"""Transactional mode: the workspace kept as an image in the log, no checkpoint.

Before a call the workspace is scanned and any change made outside the calls is
committed with the call's start mark; after it, the call's diff is committed in the same
transaction as its outcome, so the image is always the workspace as of the last
committed call. After a crash the workspace is made equal to the image again (write back
what differs, delete what the image lacks); a lost Space is rebuilt from the log alone.
A workspace the image cannot hold (over the limits, a name it cannot represent, a
process a wrapped command left running) is refused before a call; one that a call made
so is recorded as the reason: auto mode switches to checkpoints for it, explicit
transactional mode marks the image stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from durable_spaces.adapter import image_log
from durable_spaces.adapter.image import ImageLimits, apply
from durable_spaces.adapter.image_log import ImageUpdate
from durable_spaces.adapter.modes import processes_in_workspace
from durable_spaces.adapter.parts import Parts
from durable_spaces.adapter.state import SpaceState
from durable_spaces.chaos.failpoints import hit
from durable_spaces.space import PathTable, Space

if TYPE_CHECKING:
    from durable_spaces.harness.scheduler import Harness


class TransactionalKeeper:
    def __init__(self, parts: Parts) -> None:
        self.p = parts
        self._scans: dict[str, PathTable] = {}  # auto's scan at this call's boundary

    @property
    def limits(self) -> ImageLimits:
        return self.p.config.limits

    # --- a call's boundary ------------------------------------------------------------------

    def new_boundary(self, space: Space) -> None:
        """Only a scan taken at this call's boundary may stand for its start."""
        self._scans.pop(space.name, None)

    async def boundary_scan(self, space: Space) -> PathTable:
        """Auto mode's check of the limits at the boundary; kept for the start mark."""
        table = await space.scan(".", self.limits.exclude)
        self._scans[space.name] = table
        return table

    async def start_table(self, space: Space) -> PathTable:
        """The workspace at a call's start: the scan auto mode just took, else a new one."""
        table = self._scans.pop(space.name, None)
        return table if table is not None else await space.scan(".", self.limits.exclude)

    async def start_update(
        self, harness: Harness, conv: str, space: Space, table: PathTable
    ) -> ImageUpdate | None:
        """What the start mark's commit adds: the changes made outside the calls."""
        await self.p.boot.require_same(space)  # the scan saw this machine's disk
        return await image_log.update(harness, conv, space, table)

    async def outcome_update(
        self,
        harness: Harness,
        conv: str,
        state: SpaceState,
        space: Space,
        tool: str,
        written: Mapping[str, bytes] | None = None,
    ) -> tuple[ImageUpdate | None, str | None]:
        """After the effect: the call's diff for the outcome's commit, or why the image
        cannot hold the workspace now. Returns (update, reason to switch to checkpoint
        mode); explicit transactional mode records the reason as ``image_stale``.
        ``written``: sha256 -> bytes a write/edit just wrote (never read back)."""
        table = await space.scan(".", self.limits.exclude)
        why = self.limits.violation(table)
        auto = self.p.config.mode == "auto"
        if why is None and auto and tool == "bash":
            pids = await processes_in_workspace(space, self.p.epoch_for(space.name))
            if pids:
                why = f"a wrapped bash call left processes running in the workspace: {pids}"
        if why is not None and auto:
            return None, why
        if why is not None:
            state.image_stale = why
            return None, None
        await self.p.boot.require_same(space)
        return await image_log.update(harness, conv, space, table, written), None

    # --- bringing the workspace back ------------------------------------------------------

    async def revert(self, harness: Harness, conv: str, space: Space) -> None:
        """Make the workspace equal to the image again (the caller emits ``reverted``)."""
        await apply(
            space,
            image_log.table(harness, conv),
            image_log.need_blob(harness, conv),
            self.limits.exclude,
            epoch=self.p.epoch_for(space.name),
        )

    async def rebuild(self, harness: Harness, conv: str, space: Space) -> Space:
        """A Space placed again from scratch (or a fork's new one): rebuilt from the log."""
        await self.revert(harness, conv, space)
        hit("recovery.reimaged")
        self.p.emit("reimaged", conv, None, mode="transactional", instance=space.instance_id)
        return space
