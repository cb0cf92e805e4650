"""Checkpoint providers for tests that look at a Space's copy (``.ds-checkpoints``) as
soon as a checkpoint returns: with a store, that copy is written after it returns
(``adapter/checkpoints/copy_behind.py``), so these wait for it first."""

from __future__ import annotations

from durable_spaces.adapter.checkpoints.snapshots import WorkspaceSnapshots
from durable_spaces.space import Space


class SettledSnapshots(WorkspaceSnapshots):
    """``WorkspaceSnapshots`` whose ``checkpoint`` returns once the copy is written."""

    async def checkpoint(self, space: Space, call_id: str, epoch: int) -> str:
        cid = await super().checkpoint(space, call_id, epoch)
        await self.settle()
        return cid
