"""Checkpoint mode: a checkpoint of the Space after every wrapped call.

After a call's effects and before its result entry commits: the outcome is recorded, the
Space is checkpointed (its workspace incrementally, or the whole machine), and ``{call,
checkpoint}`` is recorded, so the newest recorded checkpoint is the state before the next
call. A call whose outcome is unknown is undone by restoring the checkpoint before it
(the epoch raised first); a lost Space is restored from the newest one. Whatever is wrong
with a checkpoint ends the session (``PermanentFailure``): it is never let through as an
error of the model's call.
"""

from __future__ import annotations

import logging
import tarfile
from typing import TYPE_CHECKING

from durable_spaces.adapter import image_log
from durable_spaces.adapter import space_state as state_doc
from durable_spaces.adapter.checkpoints.snapshots import CheckpointMissing, Snapshots
from durable_spaces.adapter.log_witness import RESTORED_WALK
from durable_spaces.adapter.parts import Parts
from durable_spaces.adapter.quarantine import at_risk, kept
from durable_spaces.adapter.space_state import DOC, CallRecord, SpaceState
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import (
    CheckpointCorruptError,
    PathEscapeError,
    PermanentFailure,
    SpaceError,
    SpaceUnavailableError,
    UnsupportedNameError,
)
from durable_spaces.space import PathEntry, Space

if TYPE_CHECKING:
    from durable_spaces.harness.handles import HarnessView

logger = logging.getLogger(__name__)


def record(state: SpaceState, call_id: str, cid: str) -> None:
    """``cid`` as the checkpoint after call ``call_id``, and the newest, in ``state``."""
    rec = state.calls.get(call_id)
    if rec is not None:
        rec.checkpoint = cid
    state.last_checkpoint = cid


class CheckpointKeeper:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    @property
    def snapshots(self) -> Snapshots:
        return self.parts.config.snapshots

    async def first(self, space: Space, call_id: str) -> str:
        """The checkpoint before a conversation's first checkpointed call."""
        epoch = self.parts.epoch_for(space.name)
        cid = await self.snapshots.checkpoint(space, f"{call_id}-before", epoch)
        await self.parts.boot.require_same(space)
        return cid

    async def take(
        self,
        harness: HarnessView,
        conv: str,
        rec: CallRecord,
        space: Space,
        *,
        with_result: bool = False,
    ) -> str:
        """Checkpoint after ``rec``'s recorded outcome and record it: in a commit of its
        own, or with ``with_result`` in the call's result commit, which the caller arranges
        (``calls.CallPipeline``, with ``record``): the checkpoint then becomes the log's
        with the result entry, one commit fewer per call. Returns its id."""
        epoch = self.parts.epoch_for(space.name)
        cid = await self.snapshots.checkpoint(space, rec.call_id, epoch)
        await self.parts.boot.require_same(space)  # the checkpoint holds this boot's state
        hit("adapter.checkpoint")
        rec.checkpoint = cid
        if not with_result:
            state = state_doc.load(harness, conv)
            state.calls[rec.call_id] = rec
            state.last_checkpoint = cid
            await self.parts.commit(harness, conv, state)
        await self.prune(harness, space, taken=cid)
        return cid

    async def prune(self, harness: HarnessView, space: Space, taken: str | None = None) -> None:
        """After a checkpoint: drop the Space's checkpoints that no conversation of the
        log (this one or a fork) records any more (machine checkpoints; the Space's
        copies of workspace checkpoints when a store keeps them all), but ``taken``, the
        one just taken, whose record may still be on its way (``take``). A crash between
        a checkpoint and its record leaves one nobody records; this is where it goes."""
        prune = getattr(self.snapshots, "prune", None)
        if prune is None:
            return

        def recorded() -> set[str]:
            # Asked only when the provider prunes this time (not on every call).
            ids: set[str] = set() if taken is None else {taken}
            for c in harness.conversations():
                ids |= SpaceState.from_json(c.document(DOC)).checkpoints()
            return ids | kept(harness, self.parts.config.settings.quarantine_days)

        try:
            removed = await prune(space, recorded, self.parts.epoch_for(space.name))
        except SpaceUnavailableError:
            raise  # the Space went away: a halt, as anywhere else
        except (OSError, SpaceError) as e:  # housekeeping: the call's result stands
            logger.warning("could not prune checkpoints of %s: %s", space.name, e)
            return
        if removed:
            logger.debug("pruned checkpoints of %s: %s", space.name, removed)

    async def restore(
        self,
        harness: HarnessView,
        conv: str,
        space: Space,
        cid: str,
        *,
        gone: str,
        why: str,
        source: Space | None = None,
    ) -> tuple[Space, str | None]:
        """Restore ``cid`` into ``space``, after keeping what it deletes or replaces that
        neither the checkpoint nor the log holds (``quarantine.py``); returns the Space to
        use afterwards (a machine restore replaces it) and that quarantine's id, if one
        was needed. Whatever is wrong with the checkpoint ends the session
        (``PermanentFailure``: ``gone``, its ``{e}`` replaced, when it is missing,
        ``CheckpointCorruptError`` when no copy is intact). The Space failing is still a
        ``SpaceError`` (a halt; the next driver retries)."""
        epoch = self.parts.epoch_for(space.name)
        try:
            kept = await self._keep(harness, conv, space, cid, why, source)
            space = await self.snapshots.restore(space, cid, epoch, source=source)
        except CheckpointMissing as e:
            raise PermanentFailure(gone.replace("{e}", str(e))) from e
        except (PathEscapeError, UnsupportedNameError, ValueError, tarfile.TarError) as e:
            if isinstance(e, PermanentFailure):
                raise
            raise CheckpointCorruptError(cid, [f"{type(e).__name__}: {e}"]) from e
        self.parts.spaces.open[space.name] = space
        return space, kept

    async def _keep(
        self,
        harness: HarnessView,
        conv: str,
        space: Space,
        cid: str,
        why: str,
        source: Space | None,
    ) -> str | None:
        """The quarantine before a restore of ``cid``: what the workspace holds that the
        restore deletes or replaces, held by neither the checkpoint nor the log."""
        quarantine = self.parts.quarantine
        if self.snapshots.whole_machine:
            return await quarantine.before_machine_restore(harness, conv, space, why)
        epoch = self.parts.epoch_for(space.name)
        read = getattr(self.snapshots, "contents", None)
        want = await read(space, cid, epoch, source) if read is not None else None
        current = await space.scan(".")
        if not current:
            return None  # an empty workspace (a Space placed again): nothing to lose
        want = want or {}  # a target that cannot be read: all of it is at risk
        blobs = {ref for kind, ref in want.values() if kind == "file"}

        def held(e: PathEntry) -> bool:
            return e.kind == "file" and (
                e.sha256 in blobs or image_log.has_blob(harness, conv, e.sha256)
            )

        risky = [p for p in at_risk(current, want) if not held(current[p])]
        return await quarantine.keep(harness, conv, space, risky, why)

    async def restore_before(
        self, harness: HarnessView, conv: str, state: SpaceState, rec: CallRecord, space: Space
    ) -> Space:
        """Undo ``rec``: restore the checkpoint before it (epoch raised first)."""
        cid = rec.before or state.last_checkpoint
        if cid is None:
            raise PermanentFailure(f"call {rec.call_id} has no checkpoint before it")
        await self.parts.spaces.raise_epoch_of(space)
        space, kept = await self.restore(
            harness,
            conv,
            space,
            cid,
            gone=f"the checkpoint before call {rec.call_id} is gone ({{e}}); use a "
            "CheckpointStore or mode transactional",
            why="restored",
        )
        if self.parts.boot.watched(space.name):
            await self.parts.boot.bind(space)
        # a whole machine's ledger went back too: the log's positions since, filled in
        epoch = self.parts.epoch_for(space.name)
        await self.parts.witness.fill(conv, state, space, epoch, walk=RESTORED_WALK)
        self.parts.emit("restored", conv, rec, checkpoint=cid, **_named(kept))
        return space

    async def restore_newest(
        self,
        harness: HarnessView,
        conv: str,
        state: SpaceState,
        space: Space,
        reason: str = "machine restarted",
    ) -> Space:
        """Back to the newest checkpoint: after the machine crashed and booted again,
        or when the log is behind the Space (``reason``)."""
        assert state.last_checkpoint is not None
        await self.parts.spaces.raise_epoch_of(space)
        space, kept = await self.restore(
            harness,
            conv,
            space,
            state.last_checkpoint,
            gone=f"the Space must go back to the log ({reason}) and its checkpoint "
            f"{state.last_checkpoint} is gone ({{e}})",
            why="restored",
        )
        await self.parts.boot.bind(space)
        self.parts.emit("restored", conv, None, mode="checkpoint", reason=reason, **_named(kept))
        return space

    async def rebuild(
        self, harness: HarnessView, conv: str, state: SpaceState, space: Space
    ) -> Space:
        """A Space placed again from scratch (or a fork's new one): the newest recorded
        checkpoint, found in the store, the Space or (a fork) its parent's Space. Effects
        recorded only in the lost Space are unknown now: their calls are recovered as
        such (write/edit rerun, bash interrupted)."""
        cid = state.last_checkpoint
        if cid is None:
            raise PermanentFailure("the Space was lost and the log records no checkpoint")
        source = None
        if state.space is not None and state.space != space.name:
            source = await self.parts.config.spaces.find(state.space)  # a fork's parent Space
        space, kept = await self.restore(
            harness,
            conv,
            space,
            cid,
            source=source,
            gone=f"the Space was placed again from scratch and its checkpoint {cid} is "
            "gone with the old Space ({e}); use a CheckpointStore or mode transactional",
            why="restored",
        )
        hit("recovery.restored")
        self.parts.emit(
            "restored", conv, None, mode="checkpoint", checkpoint=cid, rebuilt=True, **_named(kept)
        )
        return space


def _named(kept: str | None) -> dict[str, str]:
    """A recovery event's ``quarantine`` detail, when a quarantine was kept."""
    return {"quarantine": kept} if kept else {}
