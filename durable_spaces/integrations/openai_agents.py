"""The OpenAI Agents SDK: the adapter's ``bash``, ``write`` and ``edit`` as function tools.

    from durable_spaces.integrations.openai_agents import durable_tools

    session = SQLiteSession("t1", "state/session.sqlite")
    agent = Agent(name="coder", tools=durable_tools("state/workspace", session=session))
    await Runner.run(agent, "continue", session=session)   # after a crash: each call once

Each tool is a ``function_tool`` whose first argument is the SDK's ``ToolContext``: its
``tool_call_id`` names the call in the log, the session's id names the thread (its Space
and the log's conversation). The SDK resumes no tool call: a session keeps the
conversation, and a program started again asks the model again (``continue``). A model
that asks for a call the log knows by its id (the same answer again) gets its result
from the log, or the adapter's recovery of it when a crash cut it off; one that answers
otherwise leaves calls the session never saved, whose effects ``threads.py`` takes out
of the Space before the new call runs. The session saves a turn's items after its
tools ran, so the calls this process ran count as held by it (``Knowledge.complete``
False).

Errors of the Space or a newer attempt's fence are raised out of the run (the tools'
``failure_error_function`` passes them on): nothing is saved for the call. Any other
error reaches the model as the SDK's default message.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from agents import RunContextWrapper, Tool, function_tool
from agents.memory import Session
from agents.tool import default_tool_error_function
from agents.tool_context import ToolContext

from durable_spaces.errors import DurableSpacesError
from durable_spaces.integrations.threads import FrameworkCall, Knowledge
from durable_spaces.integrations.workspace import DurableWorkspace

__all__ = ["durable_tools", "knowledge"]


def knowledge(items: Iterable[Any]) -> Knowledge:
    """The tool call ids a session's items mention (calls and their outputs)."""
    ids = {
        str(i["call_id"])
        for i in items
        if isinstance(i, dict) and isinstance(i.get("call_id"), str) and i["call_id"]
    }
    return Knowledge(frozenset(ids), complete=False)


def _passed_on(ctx: RunContextWrapper[Any], error: Exception) -> str:
    if isinstance(error, DurableSpacesError):
        raise error
    return default_tool_error_function(ctx, error)


def durable_tools(
    where: DurableWorkspace | str | os.PathLike[str], *, session: Session, **options: Any
) -> list[Tool]:
    """``bash``, ``write`` and ``edit`` acting in ``where`` (a ``DurableWorkspace``, or its
    state directory with ``options`` for one), for the runs of ``session``."""
    ws = where if isinstance(where, DurableWorkspace) else DurableWorkspace(where, **options)

    async def run(ctx: ToolContext[Any], tool: str, args: dict[str, Any]) -> str:
        held = knowledge(await session.get_items())
        call = FrameworkCall(tool, args, session.session_id, ctx.tool_call_id, held)
        return (await ws.run(call)).content

    @function_tool(failure_error_function=_passed_on)
    async def bash(ctx: ToolContext[Any], command: str, timeout: float | None = None) -> str:
        """Run a shell command in the workspace; returns its output and exit code.

        Args:
            command: the shell command (bash -c) to run.
            timeout: seconds before it is killed.
        """
        return await run(ctx, "bash", {"command": command, "timeout": timeout})

    @function_tool(failure_error_function=_passed_on)
    async def write(ctx: ToolContext[Any], path: str, content: str) -> str:
        """Write a whole file in the workspace (creates parent directories).

        Args:
            path: the file, relative to the workspace.
            content: its whole new content.
        """
        return await run(ctx, "write", {"path": path, "content": content})

    @function_tool(failure_error_function=_passed_on)
    async def edit(ctx: ToolContext[Any], path: str, old_text: str, new_text: str) -> str:
        """Replace `old_text` with `new_text` in a file; `old_text` must occur exactly once.

        Args:
            path: the file, relative to the workspace.
            old_text: the text to replace: it must occur exactly once.
            new_text: what replaces it.
        """
        return await run(ctx, "edit", {"path": path, "old_text": old_text, "new_text": new_text})

    return [bash, write, edit]
