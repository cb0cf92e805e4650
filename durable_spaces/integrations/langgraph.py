"""LangGraph: the adapter's ``bash``, ``write`` and ``edit`` as LangChain tools.

    from durable_spaces.integrations.langgraph import durable_tools

    tools = durable_tools("state/workspace", workspace=".")   # a DurableWorkspace's options
    agent = create_react_agent(model, tools, checkpointer=SqliteSaver(conn))
    agent.invoke(None, {"configurable": {"thread_id": "t1"}})  # resume: each call once

Each tool is a ``StructuredTool`` with LangGraph's injected arguments, as a LangGraph
user writes one: ``InjectedToolCallId`` (the call's id, which the checkpoint's AIMessage
keeps), ``InjectedState`` (the graph state the tools node runs in: its ``messages``
are what the framework's checkpoint holds, ``threads.Knowledge``) and the
``RunnableConfig`` (its ``thread_id`` names the thread: its Space and the log's
conversation). So a tools node LangGraph runs again after a crash (it always runs an
interrupted node again from its start) finds each call by its id in the log: recorded,
adopted; cut off, recovered by the adapter's table; and a checkpoint older than the
Space (async durability) gets the Space taken back to it (``threads.py``).

The tools need a checkpointer and a ``thread_id``, and the ``ToolNode`` (or
``create_react_agent``) that injects these arguments. A tool returns its text and, as
its ``artifact`` (``response_format="content_and_artifact"``), the status, the exit code
and the call's key. Errors of the Space or a newer attempt's fence are raised, not
returned: LangGraph's ``ToolNode`` raises them out of the run (its default
``handle_tool_errors`` handles only argument errors), and nothing is committed for the
call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Annotated, Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool
from langgraph.prebuilt import InjectedState
from pydantic import BaseModel, Field

from durable_spaces.errors import ConfigError
from durable_spaces.harness.tools import ToolResult
from durable_spaces.integrations.threads import FrameworkCall, Knowledge
from durable_spaces.integrations.workspace import DurableWorkspace

__all__ = ["BashInput", "EditInput", "WriteInput", "durable_tools", "knowledge"]

BASH = "Run a shell command in the workspace; returns its output and exit code."
WRITE = "Write a whole file in the workspace (creates parent directories)."
EDIT = "Replace `old_text` with `new_text` in a file; `old_text` must occur exactly once."


def durable_tools(
    where: DurableWorkspace | str | os.PathLike[str], **options: Any
) -> list[BaseTool]:
    """``bash``, ``write`` and ``edit`` acting in ``where`` (a ``DurableWorkspace``, or its
    state directory with ``options`` for one)."""
    ws = where if isinstance(where, DurableWorkspace) else DurableWorkspace(where, **options)
    return [
        _tool(ws, "bash", BASH, BashInput),
        _tool(ws, "write", WRITE, WriteInput),
        _tool(ws, "edit", EDIT, EditInput),
    ]


def knowledge(state: Any) -> Knowledge:
    """The tool call ids the graph state's ``messages`` mention."""
    messages = state.get("messages") if isinstance(state, dict) else getattr(state, "messages", ())
    ids: set[str] = set()
    for m in messages if isinstance(messages, Iterable) else ():
        if isinstance(m, dict):
            m_id, calls = m.get("tool_call_id"), m.get("tool_calls") or ()
        else:
            m_id, calls = getattr(m, "tool_call_id", None), getattr(m, "tool_calls", None) or ()
        if isinstance(m_id, str):
            ids.add(m_id)
        ids.update(str(c.get("id")) for c in calls if isinstance(c, dict) and c.get("id"))
    return Knowledge(frozenset(ids))


def _call(tool: str, kw: dict[str, Any], config: Any) -> FrameworkCall:
    call_id, state = kw.pop("tool_call_id"), kw.pop("state")
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    if thread is None:
        raise ConfigError(
            f"durable {tool}: no thread_id in the run's config: compile the graph with a "
            'checkpointer and invoke it with {"configurable": {"thread_id": ...}}'
        )
    return FrameworkCall(tool, kw, str(thread), str(call_id), knowledge(state))


def _content(result: ToolResult, call: FrameworkCall) -> tuple[str, dict[str, Any]]:
    artifact = {"status": result.status, "call_key": f"{call.thread}:{call.call_id}"}
    if "exit_code" in result.details:
        artifact["exit_code"] = result.details["exit_code"]
    return result.content, artifact


class _Injected(BaseModel):
    """What LangGraph's ``ToolNode`` gives every tool beside the model's arguments."""

    tool_call_id: Annotated[str, InjectedToolCallId]
    state: Annotated[Any, InjectedState]


class BashInput(_Injected):
    command: str = Field(description="the shell command (bash -c) to run")
    timeout: float | None = Field(default=None, description="seconds before it is killed")


class WriteInput(_Injected):
    path: str = Field(description="the file, relative to the workspace")
    content: str = Field(description="its whole new content")


class EditInput(_Injected):
    path: str = Field(description="the file, relative to the workspace")
    old_text: str = Field(description="the text to replace: it must occur exactly once")
    new_text: str = Field(description="what replaces it")


def _tool(ws: DurableWorkspace, name: str, description: str, schema: type[BaseModel]) -> BaseTool:
    def run(config: RunnableConfig, **kw: Any) -> tuple[str, dict[str, Any]]:
        call = _call(name, kw, config)
        return _content(ws.run_sync(call), call)

    async def arun(config: RunnableConfig, **kw: Any) -> tuple[str, dict[str, Any]]:
        call = _call(name, kw, config)
        return _content(await ws.run(call), call)

    return StructuredTool.from_function(
        func=run, coroutine=arun, name=name, description=description, args_schema=schema,
        response_format="content_and_artifact",
    )  # fmt: skip
