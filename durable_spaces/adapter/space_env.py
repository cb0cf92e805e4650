"""The conversation's Space as the harness's ``ExecutionEnv``.

Wrapped tools (bash, write, edit) do not go through here: their pipeline talks to the
Space itself. This serves the unwrapped ones (``read``, and any tool a user adds), so they
act in the same Space, confined to its workspace, under the session's epoch; but without
the ledger or checkpoints (DESIGN: only wrapped tools are covered).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from durable_spaces.harness.env import CallIdentity, CommandResult

if TYPE_CHECKING:
    from durable_spaces.space import Space


class _Spaces(Protocol):
    """What the env uses of its adapter (``durable.DurableSpaces``): a protocol, so this
    module does not import the adapter that imports it."""

    @property
    def cwd(self) -> str | None: ...

    def epoch_for(self, name: str) -> int: ...

    async def space(self, conversation_id: str) -> Space: ...


class SpaceExecutionEnv:
    def __init__(self, durable: _Spaces, conversation_id: str) -> None:
        self.durable = durable
        self.conversation_id = conversation_id
        self.cwd = durable.cwd or "."

    async def exec(
        self,
        command: str,
        *,
        ctx: CallIdentity | None = None,
        on_output: Callable[[bytes], None] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        space = await self.durable.space(self.conversation_id)
        res = await space.exec(
            ["bash", "-c", command],
            key=None,
            epoch=self.durable.epoch_for(space.name),
            cwd=self.durable.cwd or space.root,
            on_output=on_output,
        )
        return CommandResult(res.exit_code, res.output)

    async def read_file(self, path: str) -> bytes:
        return await (await self.durable.space(self.conversation_id)).read_file(path)

    async def write_file(self, path: str, data: bytes) -> None:
        space = await self.durable.space(self.conversation_id)
        await space.write_file(path, data, epoch=self.durable.epoch_for(space.name))

    async def exists(self, path: str) -> bool:
        space = await self.durable.space(self.conversation_id)
        return await space.stat(path) is not None
