"""One wrapped call, from its start mark to its recorded outcome, and its recovery.

The order of commits is the whole design (README.md, "Concepts" and "Recovery of an
interrupted call"):

  start mark (exec key; transactional: + outside changes)   -> adapter.start_mark
  effect (spawn / wait, or the file operation)               -> adapter.spawn/running/exit
  outcome (transactional: + the call's diff, one commit)     -> adapter.outcome_commit
  checkpoint mode: checkpoint                                 -> adapter.checkpoint
  the harness commits the result entry                        -> harness.tool_returned/tool_result
    (checkpoint mode: with the checkpoint's record, in the same commit)

Each step is a failpoint. A new driver finds the call by its ``cua.space`` record,
gathers what is known (outcome recorded / the ledger's record / the Space instance) and
carries out ``recovery.decide``'s decision, emitting one ``RecoveryEvent`` per decision.
The way the Space is kept (``transactional.py``, ``checkpointing.py``) is chosen per call
by ``modes.ModeDecider``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

from durable_spaces.adapter import checkpointing, log_witness
from durable_spaces.adapter import space_state as state_doc
from durable_spaces.adapter.effects import Effect, name_issue, written_size
from durable_spaces.adapter.image_log import ImageUpdate
from durable_spaces.adapter.recovery import Decision, RecoveryKind, decide
from durable_spaces.adapter.space_state import CallRecord, SpaceState
from durable_spaces.adapter.tool_args import ToolArgs
from durable_spaces.chaos import mutants
from durable_spaces.chaos.failpoints import hit
from durable_spaces.harness.tools import ToolContext, ToolResult
from durable_spaces.space import ExecRecord, ExecResult, ExecState, PathTable, Space

if TYPE_CHECKING:
    from durable_spaces.adapter.checkpointing import CheckpointKeeper
    from durable_spaces.adapter.modes import ModeDecider
    from durable_spaces.adapter.parts import Parts
    from durable_spaces.adapter.transactional import TransactionalKeeper
    from durable_spaces.harness.handles import HarnessView

INTERRUPTED = (
    "interrupted: the driver crashed while this command ran and its outcome is unknown; "
    "the Space was restored to the checkpoint before the call, so the command had no "
    "effect. Run it again if it is still needed."
)


class _Durable(Protocol):
    """What a call uses of its adapter (``durable.DurableSpaces``): a protocol, so this
    module does not import the adapter that imports it."""

    parts: Parts
    tx: TransactionalKeeper
    cp: CheckpointKeeper
    modes: ModeDecider

    async def space_for(self, harness: HarnessView, conv: str, state: SpaceState) -> Space: ...


class CallPipeline:
    """Runs one wrapped call (``tool`` is bash, write or edit) for a ``DurableSpaces``;
    ``args`` are already checked (``tool_args.parse``)."""

    def __init__(self, durable: _Durable, tool: str, args: ToolArgs, ctx: ToolContext):
        self.durable = durable
        self.parts = durable.parts
        self.tool = tool
        self.args = args
        self.ctx = ctx
        self.harness = ctx.harness
        self.conv = ctx.conversation_id
        config = self.parts.config
        self.effect = Effect(args, ctx, config.fence, config.cwd, config.namespace)
        self._position = ""  # the ledger key of the current start mark's position

    # --- entry ----------------------------------------------------------------------------

    async def run(self) -> ToolResult:
        space = await self.durable.space_for(
            self.harness, self.conv, state_doc.load(self.harness, self.conv)
        )
        state = state_doc.load(self.harness, self.conv)
        rec = state.calls.get(self.ctx.call_id)
        if rec is None:
            hit("adapter.call")
            return await self._fresh(state, space)
        hit("recovery.start")
        return await self._recover(state, space, rec)

    # --- a call that has not started before -------------------------------------------------

    async def _fresh(self, state: SpaceState, space: Space) -> ToolResult:
        issue = name_issue(self.args, space)
        mode = await self.durable.modes.decide(
            self.harness, self.conv, state, space, checkpoint_for=issue
        )
        state = state_doc.load(self.harness, self.conv)
        if mode == "transactional" and issue is not None:
            return ToolResult.error(
                f"refused before the call: {issue}; the transactional image cannot "
                "hold this name: rename it, or use mode='checkpoint'"
            )
        if mode == "transactional" and state.image_stale:
            return ToolResult.error(
                f"the workspace image is stale ({state.image_stale}); transactional mode "
                "cannot keep this workspace: use mode='checkpoint'"
            )
        rec = CallRecord(
            call_id=self.ctx.call_id,
            tool=self.tool,
            order=state.next_order(),
            mode=mode,
            instance=space.instance_id,
        )
        if mode == "transactional":
            table = await self.durable.tx.start_table(space)
            why = self.parts.config.limits.violation(table)
            if why is None and self.parts.config.mode == "transactional":
                # A write's size is known before its effect: refused here, as a name the
                # image cannot hold is, not written and then the image marked stale (auto
                # mode takes it and switches to checkpoints instead).
                will = written_size(self.args, space, table)
                if will is not None:
                    why = self.parts.config.limits.violation_after_write(table, *will)
            if why is not None:
                return ToolResult.error(
                    f"refused before the call: {why}; transactional mode cannot keep this "
                    "workspace: use mode='checkpoint' (or raise the limits)"
                )
            await self._start_mark(state, rec, space, table)
        else:
            if state.last_checkpoint is None:
                state.last_checkpoint = await self.durable.cp.first(space, self.ctx.call_id)
            rec.before = state.last_checkpoint
            await self._start_mark(state, rec, space, None)
        hit("adapter.start_mark")
        return await self._effect_and_finish(space, rec, "ran" if self.ctx.resumed else None)

    # --- the steps (each one commit) --------------------------------------------------------

    def _mark(self, state: SpaceState, rec: CallRecord, space: Space) -> None:
        rec.n += 1
        rec.epoch = self.parts.epoch_for(space.name)
        rec.instance = space.instance_id
        # The key names the log's next position (log_witness.py): what the Space's
        # ledger is asked when a driver binds, and never used twice, whatever the log lost.
        self._position = self.parts.witness.next_position(self.conv, state, rec)
        if mutants.active("log_behind_blind"):
            self._position += f"@{rec.epoch}"  # the defect: keys as before the witness
        rec.key = self._position if rec.tool == "bash" else None

    async def _start_mark(
        self, state: SpaceState, rec: CallRecord, space: Space, table: PathTable | None
    ) -> None:
        """The start mark; in transactional mode with any change made outside the calls."""
        self._mark(state, rec, space)
        state.calls[rec.call_id] = rec
        state.instance = space.instance_id
        state.space = space.name
        update: ImageUpdate | None = None
        if table is not None:
            update = await self.durable.tx.start_update(self.harness, self.conv, space, table)
        await self.parts.commit(self.harness, self.conv, state, update)

    async def _restart_mark(self, rec: CallRecord, space: Space) -> None:
        """A new start mark for a call that runs again (a new key, never the old one)."""
        state = state_doc.load(self.harness, self.conv)
        self._mark(state, rec, space)
        rec.outcome = None
        state.calls[rec.call_id] = rec
        await self.parts.commit(self.harness, self.conv, state)

    async def _commit_outcome(self, rec: CallRecord, space: Space) -> str | None:
        """Record the outcome (transactional: with the call's diff, in one commit); auto may
        switch to checkpoint mode in the same commit; checkpoint mode then checkpoints and
        returns the checkpoint's id, for the result's commit to record."""
        state = state_doc.load(self.harness, self.conv)
        state.calls[rec.call_id] = rec
        update: ImageUpdate | None = None
        switch: str | None = None
        if state.mode == "transactional":
            update, switch, note = await self.durable.tx.outcome_update(
                self.harness, self.conv, state, space, self.tool, self.effect.written
            )
            if note is not None and rec.outcome is not None:  # the model reads it there
                content = str(rec.outcome.get("content", ""))
                rec.outcome = {**rec.outcome, "content": f"{content}\n{note}".lstrip("\n")}
        if switch is not None:
            state.mode, state.mode_reason = "checkpoint", switch
        await self.parts.commit(self.harness, self.conv, state, update)
        hit("adapter.outcome_commit")
        if switch is not None:
            self.parts.emit("mode", self.conv, rec, reason=switch)
        if state.mode == "checkpoint":
            return await self.durable.cp.take(self.harness, self.conv, rec, space, with_result=True)
        return None

    def _record_result_entry(self, call_id: str, checkpoint: str | None = None) -> None:
        """Add the result entry's id to the call's record, and the ``checkpoint`` taken
        after it (``CheckpointKeeper.take``), in the result's own commit."""
        conv, h = self.conv, self.harness

        def build(tx: Any, entry_id: str) -> None:
            state = state_doc.load(h, conv)
            rec = state.calls.get(call_id)
            if rec is not None:
                rec.result_entry = entry_id
                if checkpoint is not None:
                    checkpointing.record(state, call_id, checkpoint)
                state_doc.put(tx, conv, state)

        self.ctx.on_result(build)

    async def _finish(self, space: Space, rec: CallRecord, outcome: dict[str, Any]) -> ToolResult:
        rec.outcome = outcome
        checkpoint = await self._commit_outcome(rec, space)
        self._record_result_entry(rec.call_id, checkpoint)
        release = getattr(self.parts.config.snapshots, "release", None)
        if checkpoint is not None and release is not None:
            name = space.name
            self.ctx.after_result(lambda: release(name))  # its Space copy (``copy_behind``)
        return _result(rec.outcome)  # with any note the outcome's commit added

    # --- the effect -------------------------------------------------------------------------

    async def _effect_and_finish(
        self, space: Space, rec: CallRecord, event: RecoveryKind | None
    ) -> ToolResult:
        epoch = self.parts.epoch_for(space.name)
        settle = getattr(self.parts.config.snapshots, "settle", None)
        if settle is not None:
            # The last checkpoint's Space copy is written (``copy_behind``) before the
            # Space changes again: the checkpoint a recovery of this call may restore
            # is then in both copies, as when it was written on the call's path.
            await settle(space.name)
        if self.tool != "bash":
            # The ledger knows this start mark's position before the file changes: a log
            # that loses the mark is then seen behind the Space (``log_witness.py``).
            await log_witness.record(space, self._position, epoch)
        if self.tool == "bash":
            assert rec.key is not None
            # Every way here follows a start mark (``_mark``): its key is new.
            res = await self.effect.command(space, rec.key, epoch, new_key=True)
            outcome = self.effect.outcome(res)
        else:
            outcome = await self.effect.file_op(space, epoch)
            hit("adapter.file_op")
            hit("adapter.mid_call")
        if event is not None:
            self.parts.emit(event, self.conv, rec, tool=self.tool)
        return await self._finish(space, rec, outcome)

    # --- recovery ---------------------------------------------------------------------------

    async def _ledger(self, space: Space, rec: CallRecord) -> tuple[ExecRecord | None, bool]:
        """The exec ledger's record of the call's key (bash, same instance) and whether it
        was started under an older epoch than this driver's."""
        if self.tool != "bash" or rec.key is None or rec.instance != space.instance_id:
            return None, False
        record = await space.exec_record(rec.key)
        older = (rec.epoch or 0) < self.parts.epoch_for(space.name)
        if older and record.state is ExecState.RUNNING:
            # Raising the epoch kills it; never reattach to a command being fenced.
            record = await _settled_record(space, rec.key)
        if mutants.active("rerun_exited") and record.state is ExecState.EXITED:
            record = ExecRecord(rec.key, ExecState.UNKNOWN)  # the defect: forget it ran
        return record, older

    async def _recover(self, state: SpaceState, space: Space, rec: CallRecord) -> ToolResult:
        ledger, older = await self._ledger(space, rec)
        decision = decide(
            outcome_recorded=rec.outcome is not None,
            same_instance=rec.instance == space.instance_id,
            mode=state.mode or rec.mode,
            ledger=ledger,
            older=older,
        )
        if decision is Decision.ADOPT:
            assert rec.outcome is not None
            taken = None
            if state.mode == "checkpoint" and rec.checkpoint is None:
                taken = await self.durable.cp.take(
                    self.harness, self.conv, rec, space, with_result=True
                )
            self.parts.emit("adopted", self.conv, rec, tool=self.tool)
            self._record_result_entry(rec.call_id, taken)
            return _result(rec.outcome)
        if decision is Decision.REATTACH:
            assert rec.key is not None
            res = await self.effect.command(space, rec.key, self.parts.epoch_for(space.name))
            self.parts.emit("reattached", self.conv, rec, tool=self.tool)
            return await self._finish(space, rec, self.effect.outcome(res))
        if decision is Decision.REPLAY:
            assert ledger is not None
            res = ExecResult(
                rec.key, ledger.exit_code, ledger.signal, ledger.output_tail, replayed=True
            )
            self.parts.emit("replayed", self.conv, rec, tool=self.tool)
            return await self._finish(space, rec, self.effect.outcome(res))
        if decision is Decision.RUN:
            await self._restart_mark(rec, space)
            hit("adapter.start_mark")
            return await self._effect_and_finish(space, rec, "ran")
        return await self._undo(state, space, rec)

    async def _undo(self, state: SpaceState, space: Space, rec: CallRecord) -> ToolResult:
        """Unknown: lost with the daemon, cut off by a newer epoch, a file tool cut
        mid-write, or effects that lived only in a lost Space."""
        if (state.mode or rec.mode) == "transactional":
            kept = await self.durable.tx.revert(self.harness, self.conv, space)
            self.parts.emit("reverted", self.conv, rec, **({"quarantine": kept} if kept else {}))
            hit("recovery.reverted")
            await self._restart_mark(rec, space)
            return await self._effect_and_finish(space, rec, "ran")
        space = await self.durable.cp.restore_before(self.harness, self.conv, state, rec, space)
        hit("recovery.restored")
        if self.tool in ("write", "edit"):
            await self._restart_mark(rec, space)
            return await self._effect_and_finish(space, rec, "ran")
        rec.outcome = {"status": "interrupted", "content": INTERRUPTED}
        rec.checkpoint = rec.before
        state = state_doc.load(self.harness, self.conv)
        state.calls[rec.call_id] = rec
        if rec.checkpoint is not None:
            state.last_checkpoint = rec.checkpoint
        await self.parts.commit(self.harness, self.conv, state)
        self.parts.emit("interrupted", self.conv, rec, tool=self.tool)
        self._record_result_entry(rec.call_id)
        return _result(rec.outcome)


async def _settled_record(space: Space, key: str, timeout: float = 10.0) -> ExecRecord:
    """The record of a command an epoch advance is killing, once it stopped running."""
    deadline = time.monotonic() + timeout
    record = await space.exec_record(key)
    while record.state is ExecState.RUNNING and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        record = await space.exec_record(key)
    return record


def _result(outcome: dict[str, Any]) -> ToolResult:
    details = {k: v for k, v in outcome.items() if k not in ("status", "content")}
    return ToolResult(str(outcome.get("content", "")), outcome.get("status", "ok"), details)
