"""A wrapped tool called in-process, as the harness would call it (a real ``Registry``,
``ToolContext`` and SQLite log, the result committed after it with what the tool added),
for tests that time or break the steps of one call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.durable import durable_spaces
from durable_spaces.adapter.space_state import DOC, SpaceState
from durable_spaces.backends import open_backend
from durable_spaces.harness.log import SqliteStorage
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tool_tasks import record_result
from durable_spaces.harness.tools import CodingTools, Registry, ToolContext
from durable_spaces.space import Space


@dataclass
class ToolSession:
    harness: Harness
    registry: Registry
    conv: str
    space: Space
    snaps: WorkspaceSnapshots
    calls: int = 0

    async def call(self, tool: str, args: dict[str, Any]) -> str:
        """Call ``tool`` (ids c1, c2, ...); its result must be ok."""
        self.calls += 1
        t = self.registry.get(tool)
        assert t is not None
        ctx = ToolContext(
            harness=self.harness, conversation_id=self.conv, call_id=f"c{self.calls}",
            tool_name=tool, task_id=f"c{self.calls}", attempt=1, resumed=False,
            env=await self.harness.env(self.conv),
        )  # fmt: skip
        res = await t.execute(args, ctx)
        assert res.status == "ok", res.content
        await record_result(self.harness, ctx, res)  # as the harness would, after it
        return str(res.content)

    def state(self) -> SpaceState:
        """The ``cua.space`` document as committed now."""
        conv = next(c for c in self.harness.conversations() if c.id == self.conv)
        return SpaceState.from_json(conv.document(DOC))


@asynccontextmanager
async def tool_session(tmp: Path) -> AsyncIterator[ToolSession]:
    """Checkpoint mode on ``local``, with a store, in ``tmp``."""
    backend = open_backend("local", tmp / "spaces")
    snaps = WorkspaceSnapshots(backend, store=DirectoryCheckpointStore(tmp / "store"))
    durable = durable_spaces(backend, snapshots=snaps, mode="checkpoint", epoch=1)
    registry = Registry().install(CodingTools).install(durable.extension)
    harness = await Harness.open(
        SqliteStorage(tmp / "log.sqlite"), models={}, registry=registry, env=durable.env
    )
    try:
        conv = (await harness.root(AgentConfig(model="none"))).id
        space = await durable.space(conv)
        yield ToolSession(harness, registry, conv, space, snaps)
    finally:
        await harness.close()
        for name in await backend.names():
            await backend.delete(name)
        await backend.close()
