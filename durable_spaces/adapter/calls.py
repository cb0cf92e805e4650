"""One wrapped call, from its start mark to its recorded outcome, and its recovery.

The order of commits is the whole design (DESIGN.md "Modes" and "Recovery"):

  start mark (exec key; transactional: + outside changes)   -> adapter.start_mark
  effect (spawn / wait, or the file operation)               -> adapter.spawn/running/exit
  outcome (transactional: + the call's diff, one commit)     -> adapter.outcome_commit
  checkpoint mode: checkpoint, then record it                -> adapter.checkpoint(_commit)
  the harness commits the result entry                        -> harness.tool_returned/tool_result

Each step is a failpoint. A new driver finds the call by its ``cua.space`` record and
decides from what is known (outcome recorded / ledger says running / exited / never
started / unknown), emitting one ``RecoveryEvent`` per decision.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from durable_spaces.adapter import image as img
from durable_spaces.adapter.recovery import RecoveryKind
from durable_spaces.adapter.state import CallRecord, SpaceState
from durable_spaces.adapter.tool_args import BashArgs, EditArgs, ToolArgs, WriteArgs
from durable_spaces.chaos import mutants
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import StaleEpochError
from durable_spaces.harness.tools import ToolContext, ToolResult
from durable_spaces.space import (
    MAX_SCAN_DEPTH,
    ExecRecord,
    ExecResult,
    ExecState,
    Space,
    confine,
    name_problem,
)

if TYPE_CHECKING:
    from durable_spaces.adapter.durable import DurableSpaces

STREAM_FENCE_INTERVAL = 0.2
RUNNING_MARK = 0.05
#: A wrapped command's output kept for its result (head and tail; the rest counted), and
#: the most it streams live: the log must not grow by what a command prints.
OUTPUT_KEEP_BYTES = 1 << 20
#: Exit status of coreutils ``timeout`` when the time ran out.
TIMED_OUT = 124


class CallPipeline:
    """Runs one wrapped call (``tool`` is bash, write or edit) for a ``DurableSpaces``;
    ``args`` are already checked (``tool_args.parse``)."""

    def __init__(self, durable: DurableSpaces, tool: str, args: ToolArgs, ctx: ToolContext):
        self.d = durable
        self.tool = tool
        self.args = args
        self.ctx = ctx
        self.conv = ctx.conversation_id
        self._fence_checked = 0.0
        self._fence_ok = True
        self._streamed = 0

    # --- entry ----------------------------------------------------------------------------

    async def run(self) -> ToolResult:
        state = self.d.load_state(self.ctx.harness, self.conv)
        space = await self.d.space_for(self.ctx.harness, self.conv, state)
        state = self.d.load_state(self.ctx.harness, self.conv)
        rec = state.calls.get(self.ctx.call_id)
        if rec is None:
            hit("adapter.call")
            return await self._fresh(state, space)
        hit("recovery.start")
        return await self._recover(state, space, rec)

    # --- a call that has not started before -------------------------------------------------

    def _name_problem(self, space: Space) -> str | None:
        """Why the image could not hold the file this write/edit names (checked before it
        is written: written first and refused after, it would leave the workspace ahead
        of the log)."""
        if isinstance(self.args, BashArgs):
            return None
        rel = confine(space.root, self.args.path)
        for part in rel.split("/"):
            if (why := name_problem(part)) is not None:
                return f"{self.args.path!r}: {why}"
        if rel.count("/") >= MAX_SCAN_DEPTH:
            return f"{self.args.path!r}: deeper than {MAX_SCAN_DEPTH} levels"
        return None

    async def _fresh(self, state: SpaceState, space: Space) -> ToolResult:
        name_issue = self._name_problem(space)
        mode = await self.d.decide_mode(
            self.ctx.harness, self.conv, state, space, checkpoint_for=name_issue
        )
        state = self.d.load_state(self.ctx.harness, self.conv)
        if mode == "transactional" and name_issue is not None:
            return ToolResult.error(
                f"refused before the call: {name_issue}; the transactional image cannot "
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
            table = await self.d.scan_for_start(space)
            if (why := self.d.limits.violation(table)) is not None:
                return ToolResult.error(
                    f"refused before the call: {why}; transactional mode cannot keep this "
                    "workspace: use mode='checkpoint' (or raise the limits)"
                )
            await self.d.commit_start(self.ctx.harness, self.conv, state, rec, space, table)
        else:
            if state.last_checkpoint is None:
                state.last_checkpoint = await self.d.snapshots_for().checkpoint(
                    space, f"{self.ctx.call_id}-before", self.d.epoch_for(space.name)
                )
                await self.d.require_same_machine(space)
            rec.before = state.last_checkpoint
            await self.d.commit_start(self.ctx.harness, self.conv, state, rec, space, None)
        hit("adapter.start_mark")
        return await self._effect_and_finish(space, rec, "ran" if self.ctx.resumed else None)

    # --- the effect -------------------------------------------------------------------------

    async def _effect_and_finish(
        self, space: Space, rec: CallRecord, event: RecoveryKind | None
    ) -> ToolResult:
        if self.tool == "bash":
            res = await self._run_bash(space, rec)
            outcome = self._bash_outcome(res)
        else:
            outcome = await self._file_effect(space)
            hit("adapter.file_op")
            hit("adapter.mid_call")
        if event is not None:
            self.d.emit(event, self.conv, rec, tool=self.tool)
        return await self._finish(space, rec, outcome)

    def _argv(self) -> list[str]:
        assert isinstance(self.args, BashArgs)
        argv = ["bash", "-c", self.args.command]
        if self.args.timeout is not None:
            # The limit lives in the Space with the command (coreutils ``timeout``), so a
            # reattached or replayed command keeps it, and it holds with no driver alive.
            argv = ["timeout", "-k", "5", f"{self.args.timeout:g}", *argv]
        return argv

    async def _run_bash(self, space: Space, rec: CallRecord, reattach: bool = False) -> ExecResult:
        assert rec.key is not None
        execution = await space.spawn(
            self._argv(),
            key=rec.key,
            epoch=self.d.epoch_for(space.name),
            cwd=self.d.cwd or space.root,
            keep_output=OUTPUT_KEEP_BYTES,
        )
        hit("adapter.spawn")
        # "running": the command is still going a moment after it started.
        running = asyncio.get_running_loop().call_later(RUNNING_MARK, _running_mark)
        try:
            async for chunk in execution.output():
                self._forward(chunk)
            res = await execution.wait()
        finally:
            running.cancel()
        hit("adapter.exit")
        return res

    def _forward(self, chunk: bytes) -> None:
        """Live output, unless the fence says a newer driver exists (checked <= 5/s), and
        at most ``OUTPUT_KEEP_BYTES`` of it (the harness commits what it streams)."""
        if self._streamed >= OUTPUT_KEEP_BYTES:
            return
        chunk = chunk[: OUTPUT_KEEP_BYTES - self._streamed]
        self._streamed += len(chunk)
        now = time.monotonic()
        if self.d.fence is not None and now - self._fence_checked >= STREAM_FENCE_INTERVAL:
            self._fence_checked = now
            try:
                self.d.fence.check()
                self._fence_ok = True
            except StaleEpochError:
                self._fence_ok = False
        if self._fence_ok:
            self.ctx.output(chunk.decode(errors="replace"))
            if self._streamed >= OUTPUT_KEEP_BYTES:
                self.ctx.output("\n[live output stops here; the result keeps its end]\n")

    async def _file_effect(self, space: Space) -> dict[str, Any]:
        hit("adapter.before_file_op")  # a driver paused here must never write after a takeover
        epoch = self.d.epoch_for(space.name)
        if isinstance(self.args, WriteArgs):
            path, data = self.args.path, self.args.content.encode()
            await space.write_file(path, data, epoch=epoch)
            return {"status": "ok", "content": f"wrote {len(data)} bytes to {path}"}
        assert isinstance(self.args, EditArgs)
        path = self.args.path
        st = await space.stat(path)
        if st is None or st.kind != "file":
            return {"status": "error", "content": f"edit: {path} does not exist"}
        # Bytes in, bytes out: a file that is not UTF-8 keeps every byte the edit does not
        # replace (decoding it with replacement characters would corrupt them).
        data = await space.read_file(path)
        old, new = self.args.old_text.encode(), self.args.new_text.encode()
        count = data.count(old)
        if count != 1:
            why = "not found" if count == 0 else f"found {count} times"
            return {"status": "error", "content": f"edit: old_text {why} in {path}"}
        await space.write_file(path, data.replace(old, new, 1), st.mode, epoch=epoch)
        return {"status": "ok", "content": f"edited {path}"}

    def _bash_outcome(self, res: ExecResult) -> dict[str, Any]:
        return bash_outcome(res, self.args.timeout if isinstance(self.args, BashArgs) else None)

    # --- after the effect -------------------------------------------------------------------

    async def _finish(self, space: Space, rec: CallRecord, outcome: dict[str, Any]) -> ToolResult:
        rec.outcome = outcome
        await self.d.commit_outcome(self.ctx.harness, self.conv, rec, space, self.tool)
        self.d.record_result_entry(self.ctx, rec.call_id)
        return _result(outcome)

    # --- recovery ---------------------------------------------------------------------------

    async def _recover(self, state: SpaceState, space: Space, rec: CallRecord) -> ToolResult:
        same_instance = rec.instance == space.instance_id
        if rec.outcome is not None and (same_instance or state.mode == "transactional"):
            if state.mode == "checkpoint" and rec.checkpoint is None:
                await self.d.take_checkpoint(self.ctx.harness, self.conv, rec, space)
            self.d.emit("adopted", self.conv, rec, tool=self.tool)
            self.d.record_result_entry(self.ctx, rec.call_id)
            return _result(rec.outcome)

        if self.tool == "bash" and same_instance and rec.key is not None:
            record = await space.exec_record(rec.key)
            older = (rec.epoch or 0) < self.d.epoch_for(space.name)
            if older and record.state is ExecState.RUNNING:
                # Raising the epoch kills it; never reattach to a command being fenced.
                record = await _settled_record(space, rec.key)
            if record.state is ExecState.RUNNING and not older:
                res = await self._run_bash(space, rec)
                self.d.emit("reattached", self.conv, rec, tool=self.tool)
                return await self._finish(space, rec, self._bash_outcome(res))
            if mutants.active("rerun_exited") and record.state is ExecState.EXITED:
                record = ExecRecord(rec.key, ExecState.UNKNOWN)  # the defect: forget it ran
            if record.state is ExecState.EXITED and (
                not older or (record.exit_code == 0 and record.signal is None)
            ):
                res = ExecResult(
                    rec.key, record.exit_code, record.signal, record.output_tail, replayed=True
                )
                self.d.emit("replayed", self.conv, rec, tool=self.tool)
                return await self._finish(space, rec, self._bash_outcome(res))
            if record.state is ExecState.UNKNOWN:
                await self.d.restart_mark(self.ctx.harness, self.conv, rec, space)
                hit("adapter.start_mark")
                return await self._effect_and_finish(space, rec, "ran")

        # Unknown: lost with the daemon, cut off by a newer epoch, a file tool cut
        # mid-write, or effects that lived only in a lost Space.
        mode = state.mode or rec.mode
        if mode == "transactional":
            await self.d.revert(self.ctx.harness, self.conv, space, rec)
            hit("recovery.reverted")
            await self.d.restart_mark(self.ctx.harness, self.conv, rec, space)
            return await self._effect_and_finish(space, rec, "ran")
        space = await self.d.restore_before(self.ctx.harness, self.conv, state, rec, space)
        hit("recovery.restored")
        if self.tool in ("write", "edit"):
            await self.d.restart_mark(self.ctx.harness, self.conv, rec, space)
            return await self._effect_and_finish(space, rec, "ran")
        outcome = {
            "status": "interrupted",
            "content": "interrupted: the driver crashed while this command ran and its "
            "outcome is unknown; the Space was restored to the checkpoint before the call, "
            "so the command had no effect. Run it again if it is still needed.",
        }
        rec.outcome = outcome
        rec.checkpoint = rec.before
        await self.d.commit_interrupted(self.ctx.harness, self.conv, rec)
        self.d.emit("interrupted", self.conv, rec, tool=self.tool)
        self.d.record_result_entry(self.ctx, rec.call_id)
        return _result(outcome)


def _running_mark() -> None:
    # From a timer: whether these are hit depends on how long the command ran, so they
    # are not logical positions of the run (see chaos/failpoints.py).
    hit("adapter.running", timer=True)
    hit("adapter.mid_call", timer=True)  # the effect may have happened, not recorded


async def _settled_record(space: Space, key: str, timeout: float = 10.0) -> ExecRecord:
    """The record of a command an epoch advance is killing, once it stopped running."""
    deadline = time.monotonic() + timeout
    record = await space.exec_record(key)
    while record.state is ExecState.RUNNING and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        record = await space.exec_record(key)
    return record


def bash_outcome(res: ExecResult, timeout: float | None = None) -> dict[str, Any]:
    """The recorded outcome of a wrapped command (its output already bounded)."""
    text = res.output.decode(errors="replace")
    code = res.exit_code
    status = "ok" if code == 0 else "error"
    if timeout is not None and code in (TIMED_OUT, 128 + 9):
        tail = f"\n[killed: timed out after {timeout:g} s]"
    elif code is not None:
        tail = f"\n[exit code {code}]"
    else:
        tail = f"\n[killed by signal {res.signal}]"
    outcome: dict[str, Any] = {
        "status": status,
        "content": (text + tail).lstrip("\n"),
        "exit_code": code,
    }
    if res.omitted:
        outcome["output_omitted_bytes"] = res.omitted
    return outcome


def _result(outcome: dict[str, Any]) -> ToolResult:
    details = {k: v for k, v in outcome.items() if k not in ("status", "content")}
    return ToolResult(str(outcome.get("content", "")), outcome.get("status", "ok"), details)


__all__ = ["CallPipeline", "img"]
