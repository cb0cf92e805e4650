"""pydantic-ai: the adapter's ``bash``, ``write`` and ``edit`` as a toolset.

    from durable_spaces.integrations.pydantic_ai import durable_toolset

    agent = Agent(model, toolsets=[durable_toolset("state/workspace")],
                  capabilities=[DBOSDurability()])

Each tool takes pydantic-ai's ``RunContext``: its ``tool_call_id`` names the call in the
log, its ``conversation_id`` the thread (its Space and the log's conversation; inside a
DBOS workflow pydantic-ai derives it from the workflow's run, so a recovered workflow
keeps it), its ``messages`` are what the framework holds (``threads.Knowledge``: the
model's tool calls and their returns, recorded by DBOS as the model requests' step
outputs). DBOS recovers a workflow by running it again from its start: the model
requests are steps (their recorded answers come back), the tools are not, so every
tool call of the workflow runs again; each finds its result in the log and leaves the
Space alone, and the one a crash cut off is recovered by the adapter's table. A model
request whose recorded answer was lost (a lost tail) is asked again: an answer with new
call ids leaves calls the log has and the framework does not, taken out of the Space
before the first new call runs (``threads.py``).

Errors of the Space or a newer attempt's fence are raised out of the run (pydantic-ai
passes a tool's exceptions on), so nothing is recorded for the call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.toolsets import FunctionToolset

from durable_spaces.errors import ConfigError
from durable_spaces.integrations.threads import FrameworkCall, Knowledge
from durable_spaces.integrations.workspace import DurableWorkspace

__all__ = ["durable_toolset", "knowledge"]


def knowledge(messages: Iterable[Any]) -> Knowledge:
    """The tool call ids a run's messages mention (the model's calls, their returns)."""
    ids = {
        part.tool_call_id
        for m in messages
        for part in getattr(m, "parts", ())
        if isinstance(getattr(part, "tool_call_id", None), str)
    }
    return Knowledge(frozenset(ids))


def _call(ctx: RunContext[Any], tool: str, args: dict[str, Any]) -> FrameworkCall:
    thread = ctx.conversation_id or ctx.run_id
    if not thread or not ctx.tool_call_id:
        raise ConfigError(
            f"durable {tool}: the run gave no conversation id or tool call id: call the "
            "tools through an Agent run"
        )
    return FrameworkCall(tool, args, thread, ctx.tool_call_id, knowledge(ctx.messages))


def durable_toolset(
    where: DurableWorkspace | str | os.PathLike[str], **options: Any
) -> FunctionToolset[Any]:
    """``bash``, ``write`` and ``edit`` acting in ``where`` (a ``DurableWorkspace``, or its
    state directory with ``options`` for one)."""
    ws = where if isinstance(where, DurableWorkspace) else DurableWorkspace(where, **options)
    toolset: FunctionToolset[Any] = FunctionToolset()

    @toolset.tool
    async def bash(ctx: RunContext[Any], command: str, timeout: float | None = None) -> str:
        """Run a shell command in the workspace; returns its output and exit code.

        Args:
            command: the shell command (bash -c) to run.
            timeout: seconds before it is killed.
        """
        args = {"command": command, "timeout": timeout}
        return (await ws.run(_call(ctx, "bash", args))).content

    @toolset.tool
    async def write(ctx: RunContext[Any], path: str, content: str) -> str:
        """Write a whole file in the workspace (creates parent directories).

        Args:
            path: the file, relative to the workspace.
            content: its whole new content.
        """
        return (await ws.run(_call(ctx, "write", {"path": path, "content": content}))).content

    @toolset.tool
    async def edit(ctx: RunContext[Any], path: str, old_text: str, new_text: str) -> str:
        """Replace `old_text` with `new_text` in a file; `old_text` must occur exactly once.

        Args:
            path: the file, relative to the workspace.
            old_text: the text to replace: it must occur exactly once.
            new_text: what replaces it.
        """
        args = {"path": path, "old_text": old_text, "new_text": new_text}
        return (await ws.run(_call(ctx, "edit", args))).content

    return toolset
