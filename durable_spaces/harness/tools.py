"""Tools, the registry that holds them, and the built-in coding tools.

A tool declares whether it may be replayed after a crash (``replay="safe"``): the harness
commits a tool's intent before ``execute()`` and, when a crash cut a call off, reruns only
safe tools; any other ends ``interrupted`` so the model decides. Extensions add tools and
*wrap* installed ones by name, which is how the adapter puts bash, write and edit under the
Space's ledger without the built-ins knowing. The built-ins touch the workspace only through
``ctx.env`` (the conversation's ``ExecutionEnv``).
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from durable_spaces.harness.env import ExecutionEnv
    from durable_spaces.harness.handles import HarnessView
    from durable_spaces.harness.state import Tx

logger = logging.getLogger(__name__)

Status = Literal["ok", "error", "interrupted"]
Replay = Literal["safe", "unsafe"]


@dataclass(frozen=True)
class ToolResult:
    """What a call returns to the model: text content, a status, and structured details."""

    content: str
    status: Status = "ok"
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def ok(cls, content: str, **details: Any) -> ToolResult:
        return cls(content, "ok", details)

    @classmethod
    def error(cls, content: str, **details: Any) -> ToolResult:
        return cls(content, "error", details)

    @classmethod
    def interrupted(cls, content: str, **details: Any) -> ToolResult:
        return cls(content, "interrupted", details)


class ToolContext:
    """One attempt of one tool call: who is calling, where, and the ways back to the log.

    ``attempt`` counts the committed starts of this call (2, 3, ... after a crash replay of a
    safe tool, with ``resumed`` true); ``committed_output`` is the output earlier attempts
    committed. ``output()`` streams live output; the harness commits it in throttled batches
    so an interrupted call can carry it. ``call_key`` is the call's stable key, the same
    for every attempt of the call (default ``<conversation>:<call>``): a wrapped command
    gets it as ``DS_CALL_KEY``, for an outside service's idempotency key.
    """

    def __init__(
        self,
        *,
        harness: HarnessView,
        conversation_id: str,
        call_id: str,
        tool_name: str,
        task_id: str,
        attempt: int,
        resumed: bool,
        env: ExecutionEnv,
        committed_output: str = "",
        on_output: Callable[[str], None] | None = None,
        call_key: str | None = None,
    ) -> None:
        self.harness = harness
        self.conversation_id = conversation_id
        self.call_id = call_id
        self.call_key = call_key if call_key is not None else f"{conversation_id}:{call_id}"
        self.tool_name = tool_name
        self.task_id = task_id
        self.attempt = attempt
        self.resumed = resumed
        self.env = env
        self.committed_output = committed_output
        self._on_output = on_output
        self._output: list[str] = []
        self.result_builds: list[Callable[[Tx, str], None]] = []
        self.after_results: list[Callable[[], None]] = []

    def output(self, chunk: str) -> None:
        """Report live output (kept and committed by the harness at most every ~200 ms)."""
        if not chunk:
            return
        self._output.append(chunk)
        if self._on_output is not None:
            self._on_output(chunk)

    @property
    def output_so_far(self) -> str:
        """Everything this attempt reported through ``output()``."""
        return "".join(self._output)

    def on_result(self, build: Callable[[Tx, str], None]) -> None:
        """Add ops to the very commit that records this call's result (``build`` gets the
        ``Tx`` and the result entry's id): state that must change with the outcome, or not
        at all. Dropped if execute() raises a fatal error (nothing is recorded then)."""
        self.result_builds.append(build)

    def after_result(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (on the event loop's thread) once this call's result is committed:
        work that may wait until the call is over (the Space's copy of a checkpoint,
        ``adapter/checkpoints/copy_behind.py``), so it does not share the CPU with the result's own
        commit. Never run if nothing is recorded; an error in it is logged, not raised."""
        self.after_results.append(fn)

    def run_after_result(self) -> None:
        """What ``after_result`` was given, now (the harness, after the result's commit)."""
        for fn in self.after_results:
            try:
                fn()
            except Exception:
                logger.exception("after the result of call %s", self.call_id)
        self.after_results.clear()

    async def commit(self, build: Callable[[Tx], Any]) -> Any:
        """One atomic commit to the log (same ``Tx`` as ``Conversation.commit``)."""
        return await self.harness.commit(build)

    def document(self, name: str, as_of: str | None = None) -> Any:
        """This conversation's document ``name`` (latest, or as of an entry)."""
        return self.harness.conversation(self.conversation_id).document(name, as_of=as_of)


Execute = Callable[[dict[str, Any], ToolContext], Awaitable[ToolResult]]


@dataclass(frozen=True)
class Tool:
    """A named tool with a JSON-schema ``parameters`` object and an async ``execute``."""

    name: str
    description: str
    parameters: dict[str, Any]
    execute: Execute
    replay: Replay = "unsafe"

    def with_execute(self, execute: Execute, **changes: Any) -> Tool:
        """The same tool running ``execute`` (what a wrapper usually returns)."""
        return replace(self, execute=execute, **changes)


@dataclass(frozen=True)
class Extension:
    """A bundle of tools to add and wrappers (tool name -> wrapper) for installed ones."""

    name: str
    tools: list[Tool] = field(default_factory=list)
    wrap: dict[str, Callable[[Tool], Tool]] = field(default_factory=dict)
    #: Told the harness it is installed in when that harness opens its log, before
    #: anything runs (the adapter learns the log's identity: its Spaces are named by it).
    opened: Callable[[HarnessView], None] | None = None


class Registry:
    """The tools a harness offers, in install order. Wrapping keeps a tool's position."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._opened: list[Callable[[HarnessView], None]] = []

    def install(self, item: Extension | Tool | Iterable[Tool]) -> Registry:
        """Add tools (a later tool of the same name replaces the earlier), then apply the
        extension's wrappers to the tools installed so far (a missing name is an error)."""
        if isinstance(item, Tool):
            tools, wrap = [item], {}
        elif isinstance(item, Extension):
            tools, wrap = list(item.tools), item.wrap
            if item.opened is not None:
                self._opened.append(item.opened)
        else:
            tools, wrap = list(item), {}
        for tool in tools:
            self._tools[tool.name] = tool
        for name, wrapper in wrap.items():
            if name not in self._tools:
                raise KeyError(f"cannot wrap {name!r}: no such tool installed")
            wrapped = wrapper(self._tools[name])
            if wrapped.name != name:
                raise ValueError(f"a wrapper of {name!r} must keep its name")
            self._tools[name] = wrapped
        return self

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def opened(self, harness: HarnessView) -> None:
        """Tell every installed extension that asked (``Extension.opened``) which harness
        opened (``Harness.open`` calls it once its log is read)."""
        for hook in self._opened:
            hook(harness)

    def tools(self) -> list[Tool]:
        return list(self._tools.values())


# --- the built-in coding tools -------------------------------------------------------------


def _str(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ValueError(f"argument {key!r} must be a string")
    return value


async def _read(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    path = _str(args, "path")
    if not path:
        return ToolResult.error("argument 'path' must not be empty: name a file to read")
    if not await ctx.env.exists(path):
        return ToolResult.error(f"{path}: no such file")
    try:
        raw = await ctx.env.read_file(path)
    except IsADirectoryError as e:  # a directory, a FIFO: the Space's one line, no errno
        return ToolResult.error(e.strerror or f"{path!r} is not a regular file")
    text = raw.decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    offset = max(int(args.get("offset") or 1), 1)
    limit = args.get("limit")
    end = len(lines) if limit is None else offset - 1 + int(limit)
    return ToolResult.ok("".join(lines[offset - 1 : end]), lines=len(lines))


async def _write(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    path, content = _str(args, "path"), _str(args, "content")
    data = content.encode()
    await ctx.env.write_file(path, data)
    return ToolResult.ok(f"wrote {len(data)} bytes to {path}", bytes=len(data))


async def _edit(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    path, old, new = _str(args, "path"), _str(args, "old_text"), _str(args, "new_text")
    if not old:
        return ToolResult.error("old_text must not be empty")
    if not await ctx.env.exists(path):
        return ToolResult.error(f"{path}: no such file")
    text = (await ctx.env.read_file(path)).decode()
    count = text.count(old)
    if count != 1:
        found = "not found" if count == 0 else f"found {count} times"
        return ToolResult.error(f"{path}: old_text must match exactly once; it was {found}")
    await ctx.env.write_file(path, text.replace(old, new, 1).encode())
    return ToolResult.ok(f"edited {path}")


async def _bash(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    command = _str(args, "command")
    timeout = args.get("timeout")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    result = await ctx.env.exec(
        command,
        ctx=ctx,
        on_output=lambda b: ctx.output(decoder.decode(b)),
        timeout=float(timeout) if timeout is not None else None,
    )
    ctx.output(decoder.decode(b"", final=True))
    text = result.output.decode("utf-8", errors="replace")
    if result.exit_code is None:
        return ToolResult.error(f"{text}\n[killed: timed out after {timeout} s]", exit_code=None)
    content = (
        f"{text}\n[exit code: {result.exit_code}]" if text else f"[exit code: {result.exit_code}]"
    )
    if result.exit_code != 0:
        return ToolResult.error(content, exit_code=result.exit_code)
    return ToolResult.ok(content, exit_code=0)


def _schema(required: dict[str, str], optional: dict[str, str] | None = None) -> dict[str, Any]:
    props = {k: {"type": t} for k, t in {**required, **(optional or {})}.items()}
    return {"type": "object", "properties": props, "required": list(required)}


READ = Tool(
    "read",
    "Read a text file of the workspace (optionally from line `offset`, at most `limit` lines).",
    _schema({"path": "string"}, {"offset": "integer", "limit": "integer"}),
    _read,
    replay="safe",
)
WRITE = Tool(
    "write",
    "Write a whole file in the workspace (creates parent directories).",
    _schema({"path": "string", "content": "string"}),
    _write,
)
EDIT = Tool(
    "edit",
    "Replace `old_text` with `new_text` in a file; `old_text` must occur exactly once.",
    _schema({"path": "string", "old_text": "string", "new_text": "string"}),
    _edit,
)
BASH = Tool(
    "bash",
    "Run a shell command in the workspace; returns its output and exit code.",
    _schema({"command": "string"}, {"timeout": "number"}),
    _bash,
)

#: The built-in coding tools, as one extension: ``registry.install(CodingTools)``.
CodingTools = Extension("coding", tools=[READ, WRITE, EDIT, BASH])
