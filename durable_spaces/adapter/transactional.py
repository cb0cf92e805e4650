"""Transactional mode: the workspace kept as an image in the log, no checkpoint.

Before a call the workspace is scanned and any change made outside the calls is
committed with the call's start mark; after it, the call's diff is committed in the same
transaction as its outcome, so the image is always the workspace as of the last
committed call. After a crash the workspace is made equal to the image again (write back
what differs, delete what the image lacks); a lost Space is rebuilt from the log alone.
A workspace the image cannot hold (over the limits, a name it cannot represent) is
refused before a call; one that a call made so is recorded as the reason: auto mode
switches to checkpoints for it, explicit transactional mode marks the image stale. A
process a wrapped command left running in the workspace makes auto mode switch too;
explicit mode keeps the image and reads the files such processes hold again at every
scan while they live (``leftovers``: a store through a shared mapping raises no event
a journal could see), and the call's result says it left them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from durable_spaces.adapter import image_log
from durable_spaces.adapter.image import ImageLimits, apply
from durable_spaces.adapter.image_log import ImageUpdate
from durable_spaces.adapter.leftovers import Leftovers, look, merged, reread
from durable_spaces.adapter.parts import Parts
from durable_spaces.adapter.quarantine import at_risk, content
from durable_spaces.adapter.space_state import SpaceState
from durable_spaces.chaos.failpoints import hit
from durable_spaces.space import PathEntry, PathTable, Space

if TYPE_CHECKING:
    from durable_spaces.harness.handles import HarnessView


class TransactionalKeeper:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self._scans: dict[str, PathTable] = {}  # auto's scan at this call's boundary
        #: Per Space, what the last look for leftover processes found (``leftovers``);
        #: none yet: the next scan looks (a process an earlier driver's call left).
        self._left: dict[str, Leftovers] = {}
        #: The bytes of held files the start scan read again, for its image update.
        self._fresh: dict[str, dict[str, bytes]] = {}

    @property
    def limits(self) -> ImageLimits:
        return self.parts.config.limits

    # --- a call's boundary ------------------------------------------------------------------

    def new_boundary(self, space: Space) -> None:
        """Only a scan taken at this call's boundary may stand for its start."""
        self._scans.pop(space.name, None)

    async def _look(self, space: Space, always: bool) -> Leftovers:
        """Look for leftover processes when ``always``, when there were some at the last
        look, or when this keeper has not looked yet; else the last look's answer."""
        last = self._left.get(space.name)
        if always or last is None or last:
            last = self._left[space.name] = await look(space, self.parts.epoch_for(space.name))
        return last

    async def _start_scan(self, space: Space) -> PathTable:
        """A scan at a call's start, with the files leftover processes hold read again
        (no journal vouches for them: ``leftovers``); their bytes kept for the update."""
        table = await space.scan(".", self.limits.exclude)
        left = await self._look(space, always=False)
        if left.held:
            table, self._fresh[space.name] = await reread(space, table, left.held)
        return table

    async def boundary_scan(self, space: Space) -> PathTable:
        """Auto mode's check of the limits at the boundary; kept for the start mark."""
        table = await self._start_scan(space)
        self._scans[space.name] = table
        return table

    async def start_table(self, space: Space) -> PathTable:
        """The workspace at a call's start: the scan auto mode just took, else a new one."""
        self._fresh.pop(space.name, None)
        table = self._scans.pop(space.name, None)
        return table if table is not None else await self._start_scan(space)

    async def start_update(
        self, harness: HarnessView, conv: str, space: Space, table: PathTable
    ) -> ImageUpdate | None:
        """What the start mark's commit adds: the changes made outside the calls."""
        await self.parts.boot.require_same(space)  # the scan saw this machine's disk
        fresh = self._fresh.pop(space.name, None)
        return await image_log.update(harness, conv, space, table, fresh)

    async def outcome_update(
        self,
        harness: HarnessView,
        conv: str,
        state: SpaceState,
        space: Space,
        tool: str,
        written: Mapping[str, bytes] | None = None,
    ) -> tuple[ImageUpdate | None, str | None, str | None]:
        """After the effect: the call's diff for the outcome's commit, or why the image
        cannot hold the workspace now. Returns (update, reason to switch to checkpoint
        mode, a note for the call's result); explicit transactional mode records the
        reason as ``image_stale``. ``written``: sha256 -> bytes a write/edit just wrote
        (never read back).

        After every bash call, in auto and explicit mode alike, the workspace is looked
        at for processes the command left (``leftovers``): auto leaves for checkpoints;
        explicit mode keeps the image, reads the files they hold again at every scan
        while they live, and the call that left them says so in its result."""
        table = await space.scan(".", self.limits.exclude)
        why = self.limits.violation(table)
        auto = self.parts.config.mode == "auto"
        before = self._left.get(space.name, Leftovers())
        left = await self._look(space, always=tool == "bash")
        new = tuple(p for p in left.pids if p not in before.pids) if tool == "bash" else ()
        if why is None and auto and tool == "bash" and left.pids:  # any, as it always was
            why = f"a wrapped bash call left processes running in the workspace: {list(left.pids)}"
            new = left.pids
        note = Leftovers(new).note(auto) if new else None
        if why is not None and auto:
            return None, why, note
        if why is not None:
            state.image_stale = why
            return None, None, note
        if left.held:
            table, fresh = await reread(space, table, left.held)
            written = merged(written, fresh)
        await self.parts.boot.require_same(space)
        return await image_log.update(harness, conv, space, table, written), None, note

    # --- bringing the workspace back ------------------------------------------------------

    async def revert(
        self, harness: HarnessView, conv: str, space: Space, why: str = "reverted"
    ) -> str | None:
        """Make the workspace equal to the image again (the caller emits ``reverted``),
        after keeping what it deletes or replaces that no blob of the log holds; returns
        that quarantine checkpoint's id, if one was needed (``quarantine.py``)."""
        target = image_log.table(harness, conv)
        want = {p: content(e) for p, e in target.items()}
        kept: list[str | None] = [None]

        def held(e: PathEntry) -> bool:
            return e.kind == "file" and image_log.has_blob(harness, conv, e.sha256)

        async def guard(current: PathTable) -> None:
            risky = [p for p in at_risk(current, want) if not held(current[p])]
            kept[0] = await self.parts.quarantine.keep(harness, conv, space, risky, why)

        await apply(
            space,
            target,
            image_log.need_blob(harness, conv),
            self.limits.exclude,
            epoch=self.parts.epoch_for(space.name),
            guard=guard,
        )
        return kept[0]

    async def rebuild(self, harness: HarnessView, conv: str, space: Space) -> Space:
        """A Space placed again from scratch (or a fork's new one): rebuilt from the log."""
        kept = await self.revert(harness, conv, space, why="reimaged")
        hit("recovery.reimaged")
        self.parts.emit(
            "reimaged",
            conv,
            None,
            mode="transactional",
            instance=space.instance_id,
            **({"quarantine": kept} if kept else {}),
        )
        return space
