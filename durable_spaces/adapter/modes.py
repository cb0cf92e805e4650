"""Which way a conversation's Space is kept consistent with the log.

Two mechanisms, because neither is free. *checkpoint* (a tar of the workspace, or the
whole machine, after every call) captures anything, including processes when the
machine is checkpointed, but costs a copy of the workspace per call. *transactional*
keeps a content-addressed image of the workspace in the log and costs only what changed,
but cannot capture processes or huge trees. *auto* (the default) runs transactional
while it is sound and switches to checkpoint, for good, the first time it is not: a
process left running, a workspace over the limits, a machine-checkpoint provider, missing
tooling, or a conversation that already has checkpoints. Switching back is never done: a
conversation's history would then mix two kinds of truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from durable_spaces.adapter import space_state as state_doc
from durable_spaces.adapter.image import ImageLimits
from durable_spaces.adapter.space_state import SpaceState
from durable_spaces.space import Capabilities, PathTable, Space

if TYPE_CHECKING:
    from durable_spaces.adapter.parts import Parts
    from durable_spaces.adapter.transactional import TransactionalKeeper
    from durable_spaces.harness.handles import HarnessView

CONTAINER_LIKE = frozenset({"local", "process", "container", "gvisor"})


@dataclass(frozen=True)
class ModeVerdict:
    """Whether transactional mode may continue, and if not why."""

    transactional: bool
    reason: str | None = None


def kind_allows(caps: Capabilities, whole_machine_snapshots: bool) -> ModeVerdict:
    if caps.kind in CONTAINER_LIKE or not whole_machine_snapshots:
        return ModeVerdict(True)
    return ModeVerdict(False, f"Space kind {caps.kind!r} with whole-machine checkpoints")


def limits_allow(table: PathTable, limits: ImageLimits) -> ModeVerdict:
    why = limits.violation(table)
    return ModeVerdict(why is None, why)


class ModeDecider:
    """The mode of each call: asked for, or (auto) decided at every call boundary."""

    def __init__(self, parts: Parts, tx: TransactionalKeeper) -> None:
        self.parts = parts
        self.tx = tx

    async def decide(
        self,
        harness: HarnessView,
        conv: str,
        state: SpaceState,
        space: Space,
        checkpoint_for: str | None = None,
    ) -> str:
        """The mode of the next call (auto checks every condition at the call boundary;
        ``checkpoint_for`` is a reason the next call itself gives, e.g. a file name the
        image cannot hold). A change of the conversation's mode is committed."""
        asked = self.parts.config.mode
        self.tx.new_boundary(space)
        committed = state_doc.load(harness, conv).mode
        if state.mode is None:
            if asked != "auto":
                chosen, why = asked, f"mode={asked} was asked for"
            elif state.last_checkpoint is not None:
                chosen, why = "checkpoint", "the conversation already has checkpoints"
            else:
                chosen, why = "transactional", None
            state.mode, state.mode_reason = chosen, why
        if asked != "auto" or state.mode == "checkpoint":
            if state.mode != committed:
                await self.parts.commit(harness, conv, state)
            return state.mode
        reason = checkpoint_for or await self._violation(space)
        if reason is None:
            if committed != "transactional":
                await self.parts.commit(harness, conv, state)
            return "transactional"
        state.mode, state.mode_reason = "checkpoint", reason
        await self.parts.commit(harness, conv, state)
        self.parts.emit("mode", conv, None, mode="transactional", reason=reason)
        return "checkpoint"

    async def _violation(self, space: Space) -> str | None:
        caps = await self.parts.spaces.capabilities(space)
        v = kind_allows(caps, self.parts.config.snapshots.whole_machine)
        if not v.transactional:
            return v.reason
        missing = await self.parts.spaces.tooling(space)
        if missing is not None:
            return missing
        table = await self.tx.boundary_scan(space)  # the call's start mark reuses it
        return limits_allow(table, self.parts.config.limits).reason
