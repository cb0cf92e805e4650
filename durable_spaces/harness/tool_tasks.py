"""Tool tasks: how a harness runs one tool call and records its result.

A tool task is committed ``running`` (with its attempt) before ``execute()``; its result
entry, its ``done`` state and, after the message's last tool, the next generation task
are one commit. After a crash a ``running`` task is rerun only when its tool is declared
``replay="safe"``; any other ends ``interrupted`` with the output committed so far.
Live output is committed in throttled batches (``OUTPUT_FLUSH_SECONDS``) so an
interrupted call can carry it. ``FATAL`` errors are never recorded: they stop the
harness.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from durable_spaces.chaos.failpoints import hit, in_call, leave_call
from durable_spaces.errors import HaltError, PermanentFailure, StaleEpochError
from durable_spaces.harness.handles import HarnessView
from durable_spaces.harness.state import AgentConfig, Tx
from durable_spaces.harness.tools import Registry, Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from durable_spaces.harness.env import ExecutionEnv

#: Errors that stop the harness without recording anything (never a tool result).
FATAL: tuple[type[BaseException], ...] = (StaleEpochError, HaltError, PermanentFailure)

#: How often live tool output is committed at most, and how much of it is kept.
OUTPUT_FLUSH_SECONDS = 0.2
OUTPUT_KEEP_CHARS = 64 * 1024


class _Runner(HarnessView, Protocol):
    """What a tool task uses of the harness that runs it (``scheduler.Harness``): a
    protocol, so this module does not import the scheduler that imports it."""

    registry: Registry
    _fatal: BaseException | None

    async def env(self, conversation_id: str) -> ExecutionEnv: ...

    def _commit(self, build: Callable[[Tx], Any]) -> Any: ...

    def _abort(self, exc: BaseException) -> None: ...

    def _sub_tasks(self, sid: str, kind: str) -> list[dict[str, Any]]: ...


def tools_for(h: _Runner, agent: AgentConfig) -> list[Tool]:
    """The tools an agent is offered (all installed ones, or those it names)."""
    if agent.tools is None:
        return h.registry.tools()
    return [t for n in agent.tools if (t := h.registry.get(n)) is not None]


async def run_tool(h: _Runner, task: dict[str, Any]) -> None:
    """Run one tool task: committed ``running`` before ``execute()``, its result entry
    and ``done`` in one commit; a crash-interrupted unsafe tool ends ``interrupted``.
    Failpoints hit meanwhile are the call's in a failpoint trace."""
    token = in_call(str(task.get("name")), str(task.get("call_id")))
    try:
        await _run_tool(h, task)
    finally:
        leave_call(token)


async def _run_tool(h: _Runner, task: dict[str, Any]) -> None:
    cid, tid = task["conversation_id"], task["id"]
    tool = h.registry.get(task["name"])
    resumed = task["state"] == "running"  # only a crash leaves a task running
    if tool is None:
        finish_tool(h, task, ToolResult.error(f"unknown tool {task['name']!r}"), "")
        return
    if resumed and tool.replay != "safe":
        output = task.get("output", "")
        note = (
            f"The {task['name']} call was interrupted: the process running it stopped "
            "before its result was recorded, and it was not run again (its effects, if "
            "any, are unknown)."
        )
        if output:
            note += f" Output committed before the interruption:\n{output}"
        finish_tool(h, task, ToolResult.interrupted(note), output)
        hit("harness.tool_interrupted")
        return
    env = await h.env(cid)  # before `running`: a refusal here records nothing
    attempt = int(task.get("attempt", 0)) + 1
    h._commit(lambda tx: tx._task(tid, state="running", attempt=attempt))
    hit("harness.tool_running")
    flusher = _OutputFlusher(h, tid)
    ctx = ToolContext(
        harness=h,
        conversation_id=cid,
        call_id=task["call_id"],
        tool_name=task["name"],
        task_id=tid,
        attempt=attempt,
        resumed=resumed,
        env=env,
        committed_output=task.get("output", ""),
        on_output=flusher.add,
    )
    try:
        args = task["args"]  # whatever the model sent: the tool checks it
        result = await tool.execute(dict(args) if isinstance(args, dict) else args, ctx)
        if not isinstance(result, ToolResult):
            result = ToolResult.error(f"tool returned {type(result).__name__}, not ToolResult")
    except FATAL:
        flusher.cancel()
        raise
    except asyncio.CancelledError:
        flusher.cancel()
        raise
    except Exception as e:
        result = ToolResult.error(f"{type(e).__name__}: {e}")
    flusher.cancel()
    hit("harness.tool_returned")
    finish_tool(h, task, result, ctx.output_so_far[-OUTPUT_KEEP_CHARS:], ctx.result_builds)
    hit("harness.tool_result")
    ctx.run_after_result()


def finish_tool(
    h: _Runner,
    task: dict[str, Any],
    result: ToolResult,
    output: str,
    extra: Sequence[Callable[[Tx, str], None]] = (),
) -> None:
    """The result entry, the task's end and (after the message's last tool) the next
    generation task: one commit."""
    cid, sid, tid = task["conversation_id"], task["submission_id"], task["id"]
    last = all(
        t["state"] == "done" or t["id"] == tid
        for t in h._sub_tasks(sid, "tool")
        if t["generation_id"] == task["generation_id"]
    )

    def build(tx: Tx) -> None:
        eid = _result_entry(tx, cid, task["call_id"], task["name"], result, output, extra)
        tx._task(tid, state="done", status=result.status, entry_id=eid, output=output)
        if last:
            tx._task(kind="generation", conversation_id=cid, submission_id=sid, state="pending")

    h._commit(build)


async def record_result(h: HarnessView, ctx: ToolContext, result: ToolResult) -> str:
    """The result entry of a tool called outside a tool task (a bench, a test), with the
    ops the tool added to it (``ToolContext.on_result``), in one commit as ``finish_tool``
    makes it, then what the tool asked to run after it (``ToolContext.after_result``);
    returns the entry's id. Without it such a call leaves out what belongs in its result's
    commit: a wrapped call's checkpoint record, in checkpoint mode."""

    output = ctx.output_so_far[-OUTPUT_KEEP_CHARS:]

    def build(tx: Tx) -> str:
        return _result_entry(
            tx, ctx.conversation_id, ctx.call_id, ctx.tool_name, result, output, ctx.result_builds
        )

    eid: str = await h.commit(build)
    ctx.run_after_result()
    return eid


def _result_entry(
    tx: Tx,
    conv: str,
    call_id: str,
    name: str,
    result: ToolResult,
    output: str,
    extra: Sequence[Callable[[Tx, str], None]],
) -> str:
    """The ``tool_result`` entry, and what the tool added to its commit; its id."""
    data = {
        "call_id": call_id,
        "name": name,
        "status": result.status,
        "content": result.content,
        "output": output,
        "details": result.details,
    }
    eid = tx.entry(conv, "tool_result", data)
    for build_more in extra:
        build_more(tx, eid)
    return eid


class _OutputFlusher:
    """Commits a running tool's accumulated output at most every ``OUTPUT_FLUSH_SECONDS``."""

    def __init__(self, harness: _Runner, task_id: str) -> None:
        self._h = harness
        self._tid = task_id
        self._parts: list[str] = []
        self._committed = 0
        self._last = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._closed = False

    def add(self, chunk: str) -> None:
        if self._closed:  # output after the call ended belongs to no commit
            return
        self._parts.append(chunk)
        if self._handle is None:
            delay = max(0.0, self._last + OUTPUT_FLUSH_SECONDS - time.monotonic())
            self._handle = asyncio.get_running_loop().call_later(delay, self.flush)

    def flush(self) -> None:
        self._handle = None
        text = "".join(self._parts)
        if len(text) == self._committed or self._h._fatal is not None:
            return
        self._last = time.monotonic()
        try:
            self._h._commit(lambda tx: tx._task(self._tid, output=text[-OUTPUT_KEEP_CHARS:]))
        except BaseException as e:  # _commit already stopped the harness on a fatal error
            self._h._abort(e)
            return
        self._committed = len(text)
        hit("harness.output")

    def cancel(self) -> None:
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
