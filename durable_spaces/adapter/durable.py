"""``durable_spaces(...)``: the adapter a harness installs to keep Spaces consistent.

It gives the harness two things: ``.extension`` (wraps bash, write and edit so each call
runs through ``CallPipeline``) and ``.env`` (one Space per conversation, named from its
id). Everything it knows lives in the log (the ``cua.space`` document, the image and its
blobs), so any process that opens the same log can pick up where another died.

Epochs: commands carry at least the session epoch (option or ``CUA_SESSION_EPOCH``); a
Space is advanced to it on first use, which kills every older driver's commands. A new
log on a Space already at exactly that epoch uses one above it (two sessions must never
share command keys).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable_spaces.adapter import image as img
from durable_spaces.adapter import tool_args
from durable_spaces.adapter.calls import CallPipeline
from durable_spaces.adapter.image import ImageLimits
from durable_spaces.adapter.modes import (
    Mode,
    kind_allows,
    limits_allow,
    processes_in_workspace,
    tooling_present,
)
from durable_spaces.adapter.recovery import RecoveryEvent, RecoveryKind, RecoveryListener
from durable_spaces.adapter.snapshots import (
    CheckpointMissing,
    Snapshots,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.space_env import SpaceExecutionEnv
from durable_spaces.adapter.state import (
    BLOB_DOC_PREFIX,
    DOC,
    IMAGE_DOC,
    CallRecord,
    SpaceState,
)
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import (
    CheckpointCorruptError,
    ConfigError,
    HaltError,
    PathEscapeError,
    PermanentFailure,
    SpaceError,
    SpaceUnavailableError,
    StaleEpochError,
    ToolArgumentError,
    UnsupportedNameError,
)
from durable_spaces.harness.log import Fence, check_epoch
from durable_spaces.harness.tools import Extension, Tool, ToolContext, ToolResult
from durable_spaces.session_protocol import parse_epoch
from durable_spaces.space import (
    Capabilities,
    PathTable,
    Space,
    SpaceBackend,
    space_name,
)

if TYPE_CHECKING:
    from durable_spaces.harness.scheduler import Harness, Tx

WRAPPED = ("bash", "write", "edit")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageUpdate:
    """What one commit adds to the image: the new pointer, its chain documents, blobs."""

    pointer: dict[str, int]
    chain: dict[str, object]
    blobs: dict[str, bytes]


def session_epoch(epoch: int | None) -> int:
    """The adapter's epoch: the one given (an int 1..2**63-1), else ``CUA_SESSION_EPOCH``
    parsed as strictly as the driver does (``ConfigError`` naming it)."""
    if epoch is not None:
        if check_epoch(epoch) < 1:
            raise ConfigError(f"epoch must be >= 1, not {epoch}")
        return epoch
    return parse_epoch("CUA_SESSION_EPOCH", os.environ.get("CUA_SESSION_EPOCH", "1"))


class DurableSpaces:
    """See module docstring. Build it with ``durable_spaces(...)``."""

    def __init__(
        self,
        spaces: SpaceBackend,
        snapshots: Snapshots | None = None,
        cwd: str | None = None,
        mode: Mode = "auto",
        fence: Fence | None = None,
        on_stale: Callable[[StaleEpochError], None] | None = None,
        epoch: int | None = None,
        transactional: ImageLimits | None = None,
        on_recovery: RecoveryListener | None = None,
        name_for: Callable[[str], str] | None = None,
        namespace: str | None = None,
    ) -> None:
        if mode not in ("auto", "transactional", "checkpoint"):
            raise ConfigError(f"mode must be auto, transactional or checkpoint, not {mode!r}")
        self.spaces = spaces
        self.snapshots = snapshots or WorkspaceSnapshots(spaces)
        self.cwd = cwd
        self.mode: Mode = mode
        self.fence = fence
        self.on_stale = on_stale
        self.epoch = session_epoch(epoch)
        self.limits = transactional or ImageLimits()
        self.on_recovery = on_recovery
        #: Space names derive from ``<namespace>/<conversation id>``: conversation ids are
        #: only unique within one log, Space names must be unique on the backend.
        self.namespace = namespace
        self._name_for = name_for
        self._bound: dict[str, str] = {}
        self.events: list[RecoveryEvent] = []
        #: Called with (tool, call id) as each wrapped call starts (the driver's first step).
        self.on_call: Callable[[str, str], None] | None = None
        self._open: dict[str, Space] = {}
        self._epochs: dict[str, int] = {}
        self._caps: dict[str, Capabilities] = {}
        self._tooling: dict[str, str | None] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._boot: dict[str, str] = {}  # machine boot ids seen (whole-machine Spaces)
        self._scans: dict[str, PathTable] = {}  # auto's scan at this call's boundary

    def bind(self, conversation_id: str, name: str) -> None:
        """Use the Space ``name`` for this conversation (a Space placed by a coordinator,
        e.g. ``CUA_SESSION_SPACE``) instead of one named from its id."""
        self._bound[conversation_id] = name

    def name_for(self, conversation_id: str) -> str:
        if conversation_id in self._bound:
            return self._bound[conversation_id]
        if self._name_for is not None:
            return self._name_for(conversation_id)
        ns = self.namespace
        return space_name(f"{ns}/{conversation_id}" if ns else conversation_id)

    # --- what the harness installs ----------------------------------------------------------

    @property
    def extension(self) -> Extension:
        return Extension("durable-spaces", wrap={name: self._wrapper(name) for name in WRAPPED})

    def _wrapper(self, name: str) -> Callable[[Tool], Tool]:
        def wrap(inner: Tool) -> Tool:
            async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
                return await self.run_call(name, args, ctx)

            # Safe to replay: the ledger and the log decide what a rerun really does.
            return inner.with_execute(execute, replay="safe")

        return wrap

    async def env(self, conversation_id: str) -> SpaceExecutionEnv:
        """The harness's environment factory: the conversation's Space as an env."""
        return SpaceExecutionEnv(self, conversation_id)

    def attach(
        self, fence: Fence | None, on_stale: Callable[[StaleEpochError], None] | None
    ) -> None:
        """Give the adapter the log's fence and the driver's stale callback."""
        self.fence = fence
        self.on_stale = on_stale

    # --- calls ------------------------------------------------------------------------------

    async def run_call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            parsed = tool_args.parse(tool, args)
        except ToolArgumentError as e:
            return ToolResult.error(f"{tool}: {e}")  # nothing ran, nothing to recover
        name = self.name_for(ctx.conversation_id)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            if self.on_call is not None:
                self.on_call(tool, ctx.call_id)
            try:
                return await CallPipeline(self, tool, parsed, ctx).run()
            except StaleEpochError as e:
                if self.on_stale is not None:
                    self.on_stale(e)
                raise
            except (PathEscapeError, UnsupportedNameError):
                # The model asked for a path the workspace refuses: a tool error. (A
                # checkpoint's refused archive never gets here: ``_restore`` makes it a
                # ``CheckpointCorruptError``, which like every ``PermanentFailure`` ends
                # the session instead of being recorded.)
                raise
            except SpaceError as e:
                # The Space failed (unreachable, vanished, refused an RPC), not the tool:
                # never record that as the call's result. Halt; the coordinator resumes
                # and recovery decides what the call really did.
                raise HaltError(f"the Space failed during {tool}: {e}") from e

    # --- state in the log -------------------------------------------------------------------

    def load_state(self, harness: Harness, conv: str) -> SpaceState:
        return SpaceState.from_json(harness.conversation(conv).document(DOC))

    def image_table(self, harness: Harness, conv: str, as_of: str | None = None) -> PathTable:
        pointer = harness.conversation(conv).document(IMAGE_DOC, as_of=as_of)
        return img.read_image(pointer, lambda name: self.inherited(harness, conv, name))

    @staticmethod
    def inherited(harness: Harness, conv: str, name: str) -> Any:
        """A write-once document of the conversation, else of its nearest ancestor."""
        cid: str | None = conv
        while cid is not None:
            c = harness.conversation(cid)
            value = c.document(name)
            if value is not None:
                return value
            cid = c.parent_id
        return None

    def blob(self, harness: Harness, conv: str, sha: str) -> bytes | None:
        """A blob of the image, looked up in the conversation and then its ancestors."""
        text = self.inherited(harness, conv, BLOB_DOC_PREFIX + sha)
        return None if text is None else img.decode_blob(text)

    @staticmethod
    def _put_state(tx: Tx, conv: str, state: SpaceState) -> None:
        tx.put_document(conv, DOC, state.to_json(), rewindable=True)

    async def _commit(
        self,
        harness: Harness,
        conv: str,
        state: SpaceState,
        image: ImageUpdate | None = None,
    ) -> None:
        if state.space is not None and state.space in self._boot:
            state.boot = self._boot[state.space]

        def build(tx: Tx) -> None:
            if image is not None:
                for sha, data in image.blobs.items():
                    tx.put_document(conv, BLOB_DOC_PREFIX + sha, img.encode_blob(data))
                for name, value in image.chain.items():
                    tx.put_document(conv, name, value)
                tx.put_document(conv, IMAGE_DOC, image.pointer, rewindable=True)
            self._put_state(tx, conv, state)

        await harness.commit(build)

    async def _image_update(
        self, harness: Harness, conv: str, space: Space, new_table: PathTable
    ) -> ImageUpdate | None:
        old = self.image_table(harness, conv)
        delta = img.diff(old, new_table)
        if not delta:
            return None
        blobs = await img.read_new_blobs(
            space, delta, lambda sha: self.blob(harness, conv, sha) is not None
        )
        pointer = harness.conversation(conv).document(IMAGE_DOC)
        new_pointer, chain = img.next_image(pointer, old, delta.apply(old))
        return ImageUpdate(new_pointer, chain, blobs)

    # --- the pipeline's steps (each one commit) -----------------------------------------------

    async def commit_start(
        self,
        harness: Harness,
        conv: str,
        state: SpaceState,
        rec: CallRecord,
        space: Space,
        table: PathTable | None,
    ) -> None:
        """The start mark; in transactional mode with any change made outside the calls."""
        self._mark(rec, conv, space)
        state.calls[rec.call_id] = rec
        state.instance = space.instance_id
        state.space = space.name
        update = None
        if table is not None:
            await self.require_same_machine(space)  # the scan saw this machine's disk
            update = await self._image_update(harness, conv, space, table)
        await self._commit(harness, conv, state, update)

    def _mark(self, rec: CallRecord, conv: str, space: Space) -> None:
        rec.n += 1
        rec.epoch = self.epoch_for(space.name)
        rec.instance = space.instance_id
        rec.key = f"{conv}:{rec.call_id}:{rec.n}@{rec.epoch}" if rec.tool == "bash" else None

    async def restart_mark(
        self, harness: Harness, conv: str, rec: CallRecord, space: Space
    ) -> None:
        """A new start mark for a call that runs again (a new key, never the old one)."""
        state = self.load_state(harness, conv)
        self._mark(rec, conv, space)
        rec.outcome = None
        state.calls[rec.call_id] = rec
        await self._commit(harness, conv, state)

    async def commit_outcome(
        self, harness: Harness, conv: str, rec: CallRecord, space: Space, tool: str
    ) -> None:
        """Record the outcome (transactional: with the call's diff, in one commit); auto may
        switch to checkpoint in the same commit; checkpoint mode then checkpoints."""
        state = self.load_state(harness, conv)
        state.calls[rec.call_id] = rec
        update = None
        switch: str | None = None
        if state.mode == "transactional":
            table = await space.scan(".", self.limits.exclude)
            why = self.limits.violation(table)
            if why is None and self.mode == "auto" and tool == "bash":
                pids = await processes_in_workspace(space, self.epoch_for(space.name))
                if pids:
                    why = f"a wrapped bash call left processes running in the workspace: {pids}"
            if why is not None and self.mode == "auto":
                switch = why
            elif why is not None:
                state.image_stale = why
            else:
                await self.require_same_machine(space)
                update = await self._image_update(harness, conv, space, table)
        if switch is not None:
            state.mode, state.mode_reason = "checkpoint", switch
        await self._commit(harness, conv, state, update)
        hit("adapter.outcome_commit")
        if switch is not None:
            self.emit("mode", conv, rec, reason=switch)
        if state.mode == "checkpoint":
            await self.take_checkpoint(harness, conv, rec, space)

    def record_result_entry(self, ctx: ToolContext, call_id: str) -> None:
        """Add the result entry's id to the call's record, in the result's own commit."""
        conv = ctx.conversation_id

        def build(tx: Tx, entry_id: str) -> None:
            state = self.load_state(ctx.harness, conv)
            rec = state.calls.get(call_id)
            if rec is not None:
                rec.result_entry = entry_id
                self._put_state(tx, conv, state)

        ctx.on_result(build)

    async def take_checkpoint(
        self, harness: Harness, conv: str, rec: CallRecord, space: Space
    ) -> None:
        cid = await self.snapshots_for().checkpoint(space, rec.call_id, self.epoch_for(space.name))
        await self.require_same_machine(space)  # the checkpoint holds this boot's state
        hit("adapter.checkpoint")
        state = self.load_state(harness, conv)
        rec.checkpoint = cid
        state.calls[rec.call_id] = rec
        state.last_checkpoint = cid
        await self._commit(harness, conv, state)
        hit("adapter.checkpoint_commit")
        await self.prune_checkpoints(harness, space)

    async def prune_checkpoints(self, harness: Harness, space: Space) -> None:
        """After a checkpoint commit: drop the Space's checkpoints that no conversation of
        the log (this one or a fork) records any more (machine checkpoints; the Space's
        copies of workspace tars when a store keeps them all). A crash between a
        checkpoint and its commit leaves one nobody records; this is where it goes."""
        prune = getattr(self.snapshots_for(), "prune", None)
        if prune is None:
            return

        def recorded() -> set[str]:
            # Asked only when the provider prunes this time (not on every call).
            ids: set[str] = set()
            for c in harness.conversations():
                ids |= SpaceState.from_json(c.document(DOC)).checkpoints()
            return ids

        try:
            removed = await prune(space, recorded, self.epoch_for(space.name))
        except SpaceUnavailableError:
            raise  # the Space went away: a halt, as anywhere else
        except (OSError, SpaceError) as e:  # housekeeping: the call's result stands
            logger.warning("could not prune checkpoints of %s: %s", space.name, e)
            return
        if removed:
            logger.debug("pruned checkpoints of %s: %s", space.name, removed)

    async def commit_interrupted(self, harness: Harness, conv: str, rec: CallRecord) -> None:
        state = self.load_state(harness, conv)
        state.calls[rec.call_id] = rec
        if rec.checkpoint is not None:
            state.last_checkpoint = rec.checkpoint
        await self._commit(harness, conv, state)

    async def revert(
        self, harness: Harness, conv: str, space: Space, rec: CallRecord | None
    ) -> None:
        """Transactional: make the workspace equal to the image again."""
        table = self.image_table(harness, conv)
        await img.apply(
            space,
            table,
            lambda sha: self._need_blob(harness, conv, sha),
            self.limits.exclude,
            epoch=self.epoch_for(space.name),
        )
        self.emit("reverted", conv, rec)

    def _need_blob(self, harness: Harness, conv: str, sha: str) -> bytes:
        data = self.blob(harness, conv, sha)
        if data is None:
            raise PermanentFailure(f"the log's image refers to blob {sha} that it does not hold")
        return data

    async def restore_before(
        self, harness: Harness, conv: str, state: SpaceState, rec: CallRecord, space: Space
    ) -> Space:
        """Checkpoint mode: restore the checkpoint before ``rec`` (epoch raised first)."""
        cid = rec.before or state.last_checkpoint
        if cid is None:
            raise PermanentFailure(f"call {rec.call_id} has no checkpoint before it")
        await self.raise_space_epoch(space)
        space = await self._restore(
            space,
            cid,
            gone=f"the checkpoint before call {rec.call_id} is gone ({{e}}); use a "
            "CheckpointStore or mode transactional",
        )
        self._open[space.name] = space
        if space.name in self._boot:
            await self.guest_boot(space)
        self.emit("restored", conv, rec, checkpoint=cid)
        return space

    async def _restore(
        self, space: Space, cid: str, *, gone: str, source: Space | None = None
    ) -> Space:
        """Restore ``cid`` into ``space``. Whatever is wrong with the checkpoint ends the
        session (``PermanentFailure``: ``gone``, its ``{e}`` replaced, when it is missing,
        ``CheckpointCorruptError`` when no copy is intact); it is never let through as
        an error of the model's call (``run_call`` passes ``PathEscapeError`` on as one).
        The Space failing is still a ``SpaceError`` (a halt; the next driver retries)."""
        try:
            return await self.snapshots_for().restore(
                space, cid, self.epoch_for(space.name), source=source
            )
        except CheckpointMissing as e:
            raise PermanentFailure(gone.replace("{e}", str(e))) from e
        except (PathEscapeError, UnsupportedNameError, ValueError, tarfile.TarError) as e:
            if isinstance(e, PermanentFailure):
                raise
            raise CheckpointCorruptError(cid, [f"{type(e).__name__}: {e}"]) from e

    # --- modes --------------------------------------------------------------------------------

    def snapshots_for(self) -> Snapshots:
        return self.snapshots

    async def decide_mode(
        self,
        harness: Harness,
        conv: str,
        state: SpaceState,
        space: Space,
        checkpoint_for: str | None = None,
    ) -> str:
        """The mode of the next call (auto checks every condition at the call boundary;
        ``checkpoint_for`` is a reason the next call itself gives, e.g. a file name the
        image cannot hold)."""
        self._scans.pop(space.name, None)  # only a scan taken at this boundary counts
        if state.mode is None:
            if self.mode != "auto":
                chosen, why = self.mode, f"mode={self.mode} was asked for"
            elif state.last_checkpoint is not None:
                chosen, why = "checkpoint", "the conversation already has checkpoints"
            else:
                chosen, why = "transactional", None
            state.mode, state.mode_reason = chosen, why
        if self.mode != "auto" or state.mode == "checkpoint":
            if state.mode != self.load_state(harness, conv).mode:
                await self._commit(harness, conv, state)
            return state.mode
        reason = checkpoint_for or await self._auto_violation(space)
        if reason is None:
            if self.load_state(harness, conv).mode != "transactional":
                await self._commit(harness, conv, state)
            return "transactional"
        state.mode, state.mode_reason = "checkpoint", reason
        await self._commit(harness, conv, state)
        self.emit("mode", conv, None, mode="transactional", reason=reason)
        return "checkpoint"

    async def _auto_violation(self, space: Space) -> str | None:
        caps = await self.capabilities(space)
        v = kind_allows(caps, self.snapshots.whole_machine)
        if not v.transactional:
            return v.reason
        if space.name not in self._tooling:
            t = await tooling_present(space, self.epoch_for(space.name))
            self._tooling[space.name] = t.reason
        if self._tooling[space.name] is not None:
            return self._tooling[space.name]
        table = await space.scan(".", self.limits.exclude)
        self._scans[space.name] = table  # the call's start mark reuses it
        return limits_allow(table, self.limits).reason

    async def scan_for_start(self, space: Space) -> PathTable:
        """The workspace at a call's start: the scan auto mode just took, else a new one."""
        table = self._scans.pop(space.name, None)
        return table if table is not None else await space.scan(".", self.limits.exclude)

    # --- Spaces and epochs --------------------------------------------------------------------

    def epoch_for(self, name: str) -> int:
        return self._epochs.get(name, self.epoch)

    async def capabilities(self, space: Space) -> Capabilities:
        if space.name not in self._caps:
            self._caps[space.name] = await space.capabilities()
        return self._caps[space.name]

    async def raise_space_epoch(self, space: Space, new_log: bool = False) -> None:
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
            err = StaleEpochError(target, current, "space")
            if self.on_stale is not None:
                self.on_stale(err)
            raise err
        try:
            await space.advance_epoch(target)
        except StaleEpochError as e:
            if self.on_stale is not None:
                self.on_stale(e)
            raise
        except (SpaceUnavailableError, OSError) as e:
            raise HaltError(f"cannot raise the epoch of Space {space.name}: {e}") from e
        self._epochs[space.name] = target

    async def raise_epoch(self, name: str) -> None:
        """Raise the epoch of the named Space now (the driver does this at start)."""
        space = self._open.get(name) or await self.spaces.find(name)
        if space is None:
            return
        self._open[name] = space
        await self.raise_space_epoch(space)

    async def space_for(self, harness: Harness, conv: str, state: SpaceState) -> Space:
        """The conversation's Space, consistent with the log: created on first use,
        advanced to the epoch, and rebuilt when it was lost (or is a fork's first use)."""
        name = self.name_for(conv)
        space = self._open.get(name)
        if space is None:
            space = await self.spaces.find(name)
        lost = space is None or (state.instance is not None and space.instance_id != state.instance)
        if space is None:
            space = await self.spaces.create(name)
        if name not in self._epochs:
            await self.raise_space_epoch(space, new_log=not state.has_history)
        self._open[name] = space
        if lost and state.has_history:
            space = await self._rebuild(harness, conv, state, space)
        elif state.has_history and (await self.capabilities(space)).machine_checkpoints:
            space = await self._after_machine_crash(harness, conv, state, space)
        return space

    async def guest_boot(self, space: Space) -> str | None:
        """The Space machine's kernel boot id: a crash-restart changes it; a restore of a
        machine checkpoint brings back the checkpoint's. Remembered as the one this driver
        is bound to."""
        boot = await self._read_boot(space)
        if boot:
            self._boot[space.name] = boot
        return boot

    async def _read_boot(self, space: Space) -> str | None:
        res = await space.exec(
            ["cat", "/proc/sys/kernel/random/boot_id"],
            key=None,
            epoch=self.epoch_for(space.name),
            cwd="/",
        )
        return res.output.decode(errors="replace").strip() or None if res.exit_code == 0 else None

    async def require_same_machine(self, space: Space) -> None:
        """Before a commit that vouches for a whole-machine Space's state (a checkpoint, a
        scan): its kernel must not have crashed and booted again since this driver bound
        to it. Such a restart fails nothing (the daemon comes back and answers) but loses
        what had not reached the guest's disk, so the state about to be committed may be
        torn (a file extended with zeros). Halt without committing; the next driver sees
        the boot id differ from the log's and brings back what the log implies."""
        bound = self._boot.get(space.name)
        if bound is None:
            return  # not a whole-machine Space (or its boot id is not known yet)
        now = await self._read_boot(space)
        if now != bound:
            raise SpaceUnavailableError(
                f"the machine of Space {space.name} booted again while this driver ran "
                f"(boot id {bound[:8]} -> {(now or '?')[:8]}): writes that had not reached "
                "its disk are lost"
            )

    async def _after_machine_crash(
        self, harness: Harness, conv: str, state: SpaceState, space: Space
    ) -> Space:
        """A machine with its own kernel (microVM) that was killed and booted again keeps
        only what reached its disk: writes of calls whose outcome the log holds may be
        gone. When its boot id is not the one the log last saw, bring back what the log
        implies (the newest checkpoint, or the image) and treat the calls in flight as
        unknown."""
        boot = await self.guest_boot(space)
        if boot is None or state.boot is None or boot == state.boot:
            return space
        if state.mode == "checkpoint" and state.last_checkpoint is not None:
            await self.raise_space_epoch(space)
            space = await self._restore(
                space,
                state.last_checkpoint,
                gone=f"the machine restarted and its checkpoint {state.last_checkpoint} is "
                "gone ({e})",
            )
            self._open[space.name] = space
            await self.guest_boot(space)
            self.emit("restored", conv, None, mode="checkpoint", reason="machine restarted")
        else:
            await self.revert(harness, conv, space, None)
        for rec in state.calls.values():
            if rec.checkpoint is None and state.mode == "checkpoint":
                rec.instance = None  # its effects may be gone with the crash: unknown
        await self._commit(harness, conv, state)
        return space

    async def _rebuild(self, harness: Harness, conv: str, state: SpaceState, space: Space) -> Space:
        """A Space placed again (or a fork's new Space): bring back what the log implies."""
        self._boot.pop(space.name, None)  # a new machine: its boot id is learned anew
        if state.mode == "transactional":
            await img.apply(
                space,
                self.image_table(harness, conv),
                lambda sha: self._need_blob(harness, conv, sha),
                self.limits.exclude,
                epoch=self.epoch_for(space.name),
            )
            hit("recovery.reimaged")
            self.emit("reimaged", conv, None, mode="transactional", instance=space.instance_id)
        else:
            cid = state.last_checkpoint
            if cid is None:
                raise PermanentFailure("the Space was lost and the log records no checkpoint")
            source = None
            if state.space is not None and state.space != space.name:
                source = await self.spaces.find(state.space)  # a fork's parent Space
            space = await self._restore(
                space,
                cid,
                source=source,
                gone=f"the Space was placed again from scratch and its checkpoint {cid} is "
                "gone with the old Space ({e}); use a CheckpointStore or mode transactional",
            )
            self._open[space.name] = space
            hit("recovery.restored")
            self.emit("restored", conv, None, mode="checkpoint", checkpoint=cid, rebuilt=True)
            # Effects recorded only in the lost Space are unknown now: their calls are
            # recovered as such (write/edit rerun, bash interrupted).
        state.instance = space.instance_id
        await self._commit(harness, conv, state)
        return space

    async def ensure_space(self, harness: Harness, conversation_id: str) -> None:
        """After a run settles: a Space lost after the last call is rebuilt before the
        session is reported done."""
        name = self.name_for(conversation_id)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            state = self.load_state(harness, conversation_id)
            if state.has_history:
                self._open.pop(name, None)
                await self.space_for(harness, conversation_id, state)

    async def space(self, conversation_id: str) -> Space:
        """The conversation's Space as currently open (for unwrapped tools)."""
        name = self.name_for(conversation_id)
        space = (
            self._open.get(name) or await self.spaces.find(name) or await self.spaces.create(name)
        )
        if name not in self._epochs:
            await self.raise_space_epoch(space)
        self._open[name] = space
        return space

    # --- events -------------------------------------------------------------------------------

    def emit(
        self,
        kind: RecoveryKind,
        conv: str,
        rec: CallRecord | None,
        mode: str | None = None,
        **detail: Any,
    ) -> None:
        """Record a recovery decision; every event says the mode it was decided in."""
        mode = mode or (rec.mode if rec is not None else self.mode)
        ev = RecoveryEvent(kind, mode, rec.call_id if rec else None, conv, detail)
        self.events.append(ev)
        if self.on_recovery is not None:
            self.on_recovery(ev)


def durable_spaces(
    spaces: SpaceBackend,
    snapshots: Snapshots | None = None,
    cwd: str | None = None,
    mode: Mode = "auto",
    fence: Fence | None = None,
    on_stale: Callable[[StaleEpochError], None] | None = None,
    epoch: int | None = None,
    transactional: ImageLimits | None = None,
    on_recovery: RecoveryListener | None = None,
    exclude: Sequence[str] = (),
    namespace: str | None = None,
) -> DurableSpaces:
    """Build the adapter. See ``DurableSpaces``."""
    limits = transactional or ImageLimits(exclude=tuple(exclude))
    return DurableSpaces(
        spaces,
        snapshots=snapshots,
        cwd=cwd,
        mode=mode,
        fence=fence,
        on_stale=on_stale,
        epoch=epoch,
        transactional=limits,
        on_recovery=on_recovery,
        namespace=namespace,
    )
