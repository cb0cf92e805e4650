"""``durable_spaces(...)``: the adapter a harness installs to keep Spaces consistent.

It gives the harness two things: ``.extension`` (wraps bash, write and edit so each call
runs through ``calls.CallPipeline``) and ``.env`` (one Space per conversation, named from
its id). Everything it knows lives in the log (the ``cua.space`` document, the image and
its blobs), so any process that opens the same log can pick up where another died.

The parts, each its own module: ``config`` (one frozen configuration), ``spaces`` (the
open Spaces and their epochs), ``machine`` (boot ids of whole-machine Spaces),
``transactional`` and ``checkpointing`` (the two ways of keeping a Space), ``modes``
(which way each call goes), ``recovery`` (the decision table), ``calls`` (one call's
steps). This module ties them: it binds a conversation to a Space that is consistent
with the log (created on first use, this log's and no other's (``space_owner``), rebuilt
when lost, brought back after its machine crashed or when the log lost its tail), and
runs each wrapped call under the Space's lock. The adapter serves one log: it learns the
log's identity when the harness opens it (``Extension.opened``), and names its Spaces,
keys and owner records by it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from durable_spaces.adapter import image_log, tool_args
from durable_spaces.adapter import space_state as state_doc
from durable_spaces.adapter.calls import CallPipeline
from durable_spaces.adapter.checkpointing import CheckpointKeeper
from durable_spaces.adapter.checkpoints.snapshots import Snapshots, WorkspaceSnapshots
from durable_spaces.adapter.config import AdapterConfig, Mode, session_epoch
from durable_spaces.adapter.image import ImageLimits
from durable_spaces.adapter.log_witness import RESTORED_WALK
from durable_spaces.adapter.machine import BootWatch
from durable_spaces.adapter.modes import ModeDecider
from durable_spaces.adapter.parts import Parts
from durable_spaces.adapter.recovery import RecoveryEvent, RecoveryListener
from durable_spaces.adapter.space_env import SpaceExecutionEnv
from durable_spaces.adapter.space_state import CallRecord, SpaceState
from durable_spaces.adapter.transactional import TransactionalKeeper
from durable_spaces.errors import (
    ConfigError,
    HaltError,
    PathEscapeError,
    PermanentFailure,
    SpaceError,
    StaleEpochError,
    ToolArgumentError,
    UnsupportedNameError,
)
from durable_spaces.harness.log import Fence
from durable_spaces.harness.log_core import IDENTITY
from durable_spaces.harness.tools import Extension, Tool, ToolContext, ToolResult
from durable_spaces.settings import Settings
from durable_spaces.settings import of as settings_of
from durable_spaces.space import PathTable, Space, SpaceBackend

if TYPE_CHECKING:
    from durable_spaces.harness.handles import HarnessView

WRAPPED = ("bash", "write", "edit")


class DurableSpaces:
    """See module docstring. Build it with ``durable_spaces(...)``; a driver makes its
    session's copy with ``for_session``."""

    def __init__(self, config: AdapterConfig) -> None:
        self.config = config
        self.parts = Parts.of(config)
        self.tx = TransactionalKeeper(self.parts)
        self.cp = CheckpointKeeper(self.parts)
        self.modes = ModeDecider(self.parts, self.tx)

    def for_session(self, *, log_id: str | None = None, **session: Any) -> DurableSpaces:
        """A fresh adapter on this one's configuration with the session's epoch, namespace,
        fence and callbacks (``AdapterConfig.with_session``) and its log's identity (the
        driver gives it before the harness opens); bound Spaces carry over."""
        new = DurableSpaces(self.config.with_session(**session))
        for conv, name in self.parts.spaces._bound.items():
            new.bind(conv, name, self.parts.spaces.heirs.get(conv, frozenset()))
        if log_id is not None or self.parts.spaces.log_id is not None:
            new.bind_log(log_id or self.parts.spaces.log_id or "")
        return new

    def bind_log(self, log_id: str) -> None:
        """Serve the log whose identity is ``log_id`` (``Storage.identity``). One adapter
        serves one log: its Spaces, keys and owner records are named by it."""
        keeper = self.parts.spaces
        if not log_id or not IDENTITY.fullmatch(log_id):
            raise PermanentFailure(
                f"the log has no identity durable-spaces can use ({log_id[:40]!r}): its "
                "storage must have one (Storage.identity)"
            )
        if keeper.log_id is not None and keeper.log_id != log_id:
            raise ConfigError(
                f"this adapter serves log {keeper.log_id[:12]}, not {log_id[:12]}: build "
                "one adapter per log (for_session makes a driver's copy)"
            )
        keeper.log_id = self.parts.witness.log_id = log_id

    # --- what the configuration says ----------------------------------------------------

    @property
    def spaces(self) -> SpaceBackend:
        return self.config.spaces

    @property
    def snapshots(self) -> Snapshots:
        return self.config.snapshots

    @property
    def mode(self) -> Mode:
        return self.config.mode

    @property
    def epoch(self) -> int:
        return self.config.epoch

    @property
    def cwd(self) -> str | None:
        return self.config.cwd

    @property
    def limits(self) -> ImageLimits:
        return self.config.limits

    @property
    def namespace(self) -> str | None:
        return self.config.namespace

    @property
    def fence(self) -> Fence | None:
        return self.config.fence

    @property
    def events(self) -> list[RecoveryEvent]:
        """Every recovery decision this adapter took, in order."""
        return self.parts.events

    # --- what the harness installs ----------------------------------------------------------

    @property
    def extension(self) -> Extension:
        return Extension(
            "durable-spaces",
            wrap={name: self._wrapper(name) for name in WRAPPED},
            opened=lambda harness: self.bind_log(harness.log_id),
        )

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

    def bind(self, conversation_id: str, name: str, heir_of: frozenset[str] = frozenset()) -> None:
        """Use the Space ``name`` for this conversation (a Space placed by a coordinator,
        e.g. ``CUA_SESSION_SPACE``) instead of one named from its id. ``heir_of``: this
        log's conversations whose claim on the Space this one takes over (a framework
        thread's conversation after a fork: ``integrations/threads.py``); another
        conversation's claim is refused as ever."""
        self.parts.spaces.bind(conversation_id, name, heir_of)

    def name_for(self, conversation_id: str) -> str:
        return self.parts.spaces.name_for(conversation_id)

    def epoch_for(self, name: str) -> int:
        return self.parts.spaces.epoch_for(name)

    # --- calls ------------------------------------------------------------------------------

    async def run_call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            parsed = tool_args.parse(tool, args)
            tool_args.check_call_key(ctx.call_key)
        except ToolArgumentError as e:
            return ToolResult.error(f"{tool}: {e}")  # nothing ran, nothing to recover
        name = self.name_for(ctx.conversation_id)
        async with self.parts.spaces.lock(name):
            if self.config.on_call is not None:
                self.config.on_call(tool, ctx.call_id)
            try:
                return await CallPipeline(self, tool, parsed, ctx).run()
            except StaleEpochError as e:
                if self.config.on_stale is not None:
                    self.config.on_stale(e)
                raise
            except (PathEscapeError, UnsupportedNameError):
                # The model asked for a path the workspace refuses: a tool error. (A
                # checkpoint's refused archive never gets here: ``CheckpointKeeper``
                # makes it a ``CheckpointCorruptError``, which like every
                # ``PermanentFailure`` ends the session instead of being recorded.)
                raise
            except SpaceError as e:
                # The Space failed (unreachable, vanished, refused an RPC), not the tool:
                # never record that as the call's result. Halt; the coordinator resumes
                # and recovery decides what the call really did.
                raise HaltError(f"the Space failed during {tool}: {e}") from e

    # --- the log ----------------------------------------------------------------------------

    def load_state(self, harness: HarnessView, conv: str) -> SpaceState:
        return state_doc.load(harness, conv)

    def image_table(self, harness: HarnessView, conv: str, as_of: str | None = None) -> PathTable:
        return image_log.table(harness, conv, as_of)

    def blob(self, harness: HarnessView, conv: str, sha: str) -> bytes | None:
        return image_log.blob(harness, conv, sha)

    async def take_checkpoint(
        self, harness: HarnessView, conv: str, rec: CallRecord, space: Space
    ) -> None:
        await self.cp.take(harness, conv, rec, space)

    # --- Spaces consistent with the log -------------------------------------------------------

    async def raise_epoch(self, name: str) -> None:
        """Raise the epoch of the named Space now (the driver does this at start)."""
        await self.parts.spaces.raise_epoch(name)

    async def space_for(self, harness: HarnessView, conv: str, state: SpaceState) -> Space:
        """The conversation's Space, consistent with the log: created on first use,
        advanced to the epoch, rebuilt when it was lost (or is a fork's first use),
        brought back when its machine crashed and booted again."""
        self.bind_log(harness.log_id)
        keeper = self.parts.spaces
        name = keeper.name_for(conv)
        space, missing = await keeper.find_or_create(name)
        lost = missing or (state.instance is not None and space.instance_id != state.instance)
        if not keeper.fenced(name):
            await keeper.raise_epoch_of(space, new_log=not state.has_history, conv=conv)
        keeper.open[name] = space
        if await keeper.claim(space, conv) == "take":
            space = await self._taken(harness, conv, space, missing)
        crashed = False
        if lost and state.has_history:
            space = await self._rebuild(harness, conv, state, space)
        elif state.has_history and (
            BootWatch.reports(space) or (await keeper.capabilities(space)).machine_checkpoints
        ):
            space, crashed = await self._after_machine_crash(harness, conv, state, space)
        elif BootWatch.reports(space) and not self.parts.boot.watched(space.name):
            await self.parts.boot.bind(space)  # the first commit carries the host's boot
        if not missing and not self.parts.witness.asked(name):
            space = await self._log_behind(harness, conv, space, brought_back=crashed)
        return space

    async def _taken(self, harness: HarnessView, conv: str, space: Space, missing: bool) -> Space:
        """Another log's Space was just claimed for this one, as ``DS_SPACE_ADOPT`` asked:
        as it is, or taken back to this log (``space_owner.py``)."""
        how = self.config.settings.space_adopt
        was = self.parts.spaces.previous_owner(space.name)
        self.parts.emit("claimed", conv, None, how=how, was=was.short() if was else "unknown")
        if how == "log" and not missing:
            return await self._bring_back(harness, conv, state_doc.load(harness, conv), space)
        return space

    async def _log_behind(
        self, harness: HarnessView, conv: str, space: Space, brought_back: bool
    ) -> Space:
        """Once per Space and driver: when the Space's ledger knows a position the log
        lost, bring back what the log implies as after a crash of the machine (unless
        that just happened) and skip the positions the ledger knows; then make sure it
        knows the log's last (``log_witness.py``)."""
        state = state_doc.load(harness, conv)  # as a rebuild or a crash left it
        top = await self.parts.witness.behind(conv, state, space)
        if top is not None:
            logged, state.marks = state.marks, top  # the next start mark's key is new
            if brought_back:
                await self.parts.commit(harness, conv, state)
            else:
                self.parts.emit("log_behind", conv, None, mode=state.mode, log=logged, space=top)
                space = await self._bring_back(harness, conv, state, space)  # commits
        walk = RESTORED_WALK if brought_back or top is not None else 1
        await self.parts.witness.fill(conv, state, space, self.epoch_for(space.name), walk)
        return space

    async def _rebuild(
        self, harness: HarnessView, conv: str, state: SpaceState, space: Space
    ) -> Space:
        """A Space placed again (or a fork's new Space): bring back what the log implies."""
        self.parts.boot.forget(space.name)  # a new machine: its boot id is learned anew
        if state.mode == "transactional":
            space = await self.tx.rebuild(harness, conv, space)
        else:
            space = await self.cp.rebuild(harness, conv, state, space)
        state.instance = space.instance_id
        await self.parts.commit(harness, conv, state)
        return space

    async def _after_machine_crash(
        self, harness: HarnessView, conv: str, state: SpaceState, space: Space
    ) -> tuple[Space, bool]:
        """When the machine's boot id is not the one the log last saw, bring back what the
        log implies (the newest checkpoint, or the image) and treat the calls in flight
        as unknown (see ``machine.py``). Returns the Space and whether it did."""
        if not await self.parts.boot.crashed_since_log(space, state):
            return space, False
        return await self._bring_back(harness, conv, state, space, crashed=True), True

    async def bring_back(self, harness: HarnessView, conversation_id: str, reason: str) -> None:
        """Make the conversation's Space what its log implies now, as after its machine
        crashed (the newest checkpoint, or the image; the calls in flight unknown), with
        a ``log_behind`` event giving ``reason``. For a fork that goes on in its parent's
        Space (``bind``), which holds effects the fork's log does not: an integration
        whose framework resumed from an older checkpoint than the Space's last effect
        (``durable_spaces/integrations/threads.py``)."""
        name = self.name_for(conversation_id)
        async with self.parts.spaces.lock(name):
            state = state_doc.load(harness, conversation_id)
            space = await self.space_for(harness, conversation_id, state)
            state = state_doc.load(harness, conversation_id)  # as space_for left it
            self.parts.emit("log_behind", conversation_id, None, mode=state.mode, reason=reason)
            await self._bring_back(harness, conversation_id, state, space, reason=reason)

    async def _bring_back(
        self,
        harness: HarnessView,
        conv: str,
        state: SpaceState,
        space: Space,
        crashed: bool = False,
        reason: str | None = None,
    ) -> Space:
        """The Space may hold effects the log does not (``crashed``: its machine booted
        again): back to the newest checkpoint, or the image, with the calls in flight
        unknown (committed); what only the Space held kept first (``quarantine.py``)."""
        if state.mode == "checkpoint" and state.last_checkpoint is not None:
            if reason is None:
                reason = "machine restarted" if crashed else "log is behind the Space"
            space = await self.cp.restore_newest(harness, conv, state, space, reason)
        else:
            kept = await self.tx.revert(harness, conv, space)
            self.parts.emit("reverted", conv, None, **({"quarantine": kept} if kept else {}))
        for rec in state.calls.values():
            if rec.checkpoint is None and state.mode == "checkpoint":
                rec.instance = None  # its effects may be gone with the crash: unknown
            elif rec.outcome is None:
                # In flight (transactional): the workspace went back to the image, so a
                # ledger that kept its command's exit must not be replayed over it.
                rec.instance = None
        await self.parts.commit(harness, conv, state)
        return space

    async def close(self) -> None:
        """Let go of the Space objects this adapter opened: their connections, and what
        each keeps running in its Space for its own use (the change journal's helper,
        ``spacesd/guest_journal.py``). A driver's last act; the Spaces go on."""
        keeper = self.parts.spaces
        spaces, keeper.open = list(keeper.open.values()), {}
        for space in spaces:
            with contextlib.suppress(Exception):
                await space.close()

    async def ensure_space(self, harness: HarnessView, conversation_id: str) -> None:
        """After a run settles: a Space lost after the last call is rebuilt before the
        session is reported done."""
        self.bind_log(harness.log_id)
        name = self.name_for(conversation_id)
        async with self.parts.spaces.lock(name):
            state = state_doc.load(harness, conversation_id)
            if state.has_history:
                self.parts.spaces.open.pop(name, None)
                await self.space_for(harness, conversation_id, state)

    async def space(self, conversation_id: str) -> Space:
        """The conversation's Space as currently open (for unwrapped tools)."""
        return await self.parts.spaces.space(conversation_id)


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
    name_for: Callable[[str], str] | None = None,
    settings: Settings | None = None,
) -> DurableSpaces:
    """Build the adapter: ``mode`` auto (transactional while sound, checkpoint for good
    after), transactional or checkpoint; ``snapshots`` the checkpoint provider (default:
    incremental workspace checkpoints kept in the Space); ``epoch`` the session's (default
    ``CUA_SESSION_EPOCH``); ``transactional`` the image's limits (or ``exclude``);
    ``settings`` the product's ``DS_*`` settings (default: the backend's, else read from
    the environment now: ``durable_spaces/settings.py``)."""
    settings = settings_of(settings, snapshots, spaces)
    return DurableSpaces(
        AdapterConfig(
            spaces=spaces,
            snapshots=snapshots or WorkspaceSnapshots(spaces, settings=settings),
            cwd=cwd,
            mode=mode,
            epoch=session_epoch(epoch),
            limits=transactional or ImageLimits(exclude=tuple(exclude)),
            namespace=namespace,
            name_for=name_for,
            fence=fence,
            on_stale=on_stale,
            on_recovery=on_recovery,
            settings=settings,
        )
    )


__all__ = ["WRAPPED", "DurableSpaces", "durable_spaces", "session_epoch"]
