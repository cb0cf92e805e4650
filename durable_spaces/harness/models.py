"""Models: what turns a transcript into the next assistant message.

The harness asks a model for one message per generation task and sends the same request
again after a crash, so a model must tolerate being asked twice. ``ScriptedModel`` goes
further: its answer is a pure function of the committed transcript, which is what makes
crash campaigns reproducible. ``OpenAIModel`` is a real chat model behind any
OpenAI-compatible endpoint.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from durable_spaces.host.bounded import parse_json

if TYPE_CHECKING:
    from durable_spaces.harness.state import Entry
    from durable_spaces.harness.tools import Tool


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    args: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "args": self.args}


@dataclass(frozen=True)
class AssistantMessage:
    """The model's answer: text, and tool calls to run before it is asked again."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


@runtime_checkable
class Model(Protocol):
    async def generate(
        self, messages: Sequence[Entry], tools: Sequence[Tool], system: str | None
    ) -> AssistantMessage:
        """The next assistant message for the visible transcript ``messages`` (entries of
        every kind; a model ignores kinds it does not know)."""
        ...


# --- the scripted model --------------------------------------------------------------------

_BASH = re.compile(
    r"^(?:sleep [0-9.]+ && )?(?:while \[ ! -e '[^'\n]*' \]; do sleep 0\.01; done && )?"
    r"printf '%s\\n' '([^'\n]*)' >> ([A-Za-z0-9_.-]+)$"
)
JOURNAL = "journal.txt"
#: Where a model's tool call arguments come from, for the error when they are not JSON.
ARGS = "a tool call's arguments from the model"
#: Starts a heartbeat "server" outside the workspace and prints its pid.
SERVER_COMMAND = (
    "sh -c 'echo $$ > /tmp/ds-server.pid; "
    "while :; do date +%s > /tmp/ds-server.b && mv /tmp/ds-server.b /tmp/ds-server.beat; "
    "sleep 0.2; done' >/dev/null 2>&1 & "
    "sleep 0.3; echo ds-server pid $(cat /tmp/ds-server.pid)"
)


def check_gate(path: str) -> str:
    """``path`` as a scripted command's gate: absolute, and a shell word once quoted in
    single quotes (no quote, newline or NUL in it); ``ValueError`` says why not."""
    if not path.startswith("/"):
        raise ValueError(f"gate {path!r} is not an absolute path")
    if any(c in path for c in "'\n\0"):
        raise ValueError(f"gate {path!r} holds a quote, a newline or a NUL")
    return path


def implied_workspace(entries: Sequence[Entry]) -> dict[str, str]:
    """The files a scripted run's committed transcript implies: every call whose result is
    ``ok`` applied once, in order (writes, line-inserting edits, journal appends)."""
    calls: dict[str, dict[str, Any]] = {}
    files: dict[str, str] = {}
    for e in entries:
        if e.kind == "assistant":
            for tc in e.data.get("tool_calls", []):
                calls[tc["id"]] = tc
        elif e.kind == "tool_result" and e.data.get("status") == "ok":
            tc = calls.get(e.data["call_id"])
            if tc is None:
                continue
            args = tc["args"]
            if tc["name"] == "write":
                files[args["path"]] = args["content"]
            elif tc["name"] == "edit":
                files[args["path"]] = files[args["path"]].replace(
                    args["old_text"], args["new_text"], 1
                )
            elif tc["name"] == "bash" and (parsed := ScriptedModel.interpret_bash(args["command"])):
                path, line = parsed
                files[path] = files.get(path, "") + line + "\n"
    return files


class ScriptedModel:
    """A deterministic agent: writes, line-inserting edits and appending shell commands.

    Step ``n`` (the number of tool results in the transcript) draws from
    ``random.Random(f"{seed}:{n}")`` against the workspace implied by the ``ok`` results so
    far, so after a crash it asks for exactly what it would have asked for. Every line it
    writes carries a token ``s<step>-<hex>``, so a step applied twice is visible: an
    append leaves its line twice, an edit (``old_text`` a line, ``new_text`` that line
    followed by a token line) its token line twice. A write applied twice in a row leaves
    the same file as once, by construction; applied again after a later call changed the
    file, it brings an earlier version back (the campaign checker reports both). It never
    emits a call that fails on the implied workspace. After ``steps`` results it answers
    ``"done"``.

    ``server=True`` makes step 0 start a long-lived process outside the workspace (a
    heartbeat loop writing ``/tmp/ds-server.beat``, its pid in ``/tmp/ds-server.pid``):
    what machine checkpoints must bring back after a restore.

    ``gate`` (an absolute path the Space's commands see: the host's, for ``local`` and
    ``spacesd``) makes every appending command wait until that path exists before it
    appends: a test holds a command running across a driver's restart and lets it end
    when it chooses, where a ``sleep`` would have to outlast a loaded machine.
    """

    def __init__(
        self,
        seed: int | str,
        steps: int,
        *,
        files: int = 4,
        sleep: float = 0.0,
        server: bool = False,
        gate: str | None = None,
    ) -> None:
        self.seed = seed
        self.steps = steps
        self.files = files
        self.sleep = sleep
        self.server = server
        self.gate = None if gate is None else check_gate(gate)
        self.requests = 0  # how many times it was asked (a crash makes it ask again)

    async def generate(
        self, messages: Sequence[Entry], tools: Sequence[Tool], system: str | None
    ) -> AssistantMessage:
        self.requests += 1
        step = sum(1 for e in messages if e.kind == "tool_result")
        if step >= self.steps:
            return AssistantMessage("done")
        return AssistantMessage(f"step {step}", [self.call(step, implied_workspace(messages))])

    def call(self, step: int, files: dict[str, str]) -> ToolCall:
        """The tool call of ``step`` given the implied workspace ``files``."""
        if self.server and step == 0:
            return ToolCall(f"call-server-{self.seed}", "bash", {"command": SERVER_COMMAND})
        rng = random.Random(f"{self.seed}:{step}")
        token = f"s{step}-{rng.getrandbits(32):08x}"
        editable = sorted(p for p in files if p != JOURNAL and files[p])
        kind = rng.choice(["write", "bash", *(["edit"] if editable else [])])
        cid = f"call-{token}"
        if kind == "write":
            path = f"f{rng.randrange(self.files)}.txt"
            lines = [f"{token}-{i}" for i in range(rng.randint(1, 4))]
            return ToolCall(cid, "write", {"path": path, "content": "\n".join(lines) + "\n"})
        if kind == "edit":
            path = rng.choice(editable)
            candidates = [
                line + "\n"
                for line in files[path].splitlines()
                if files[path].count(line + "\n") == 1
            ]
            if candidates:
                # The line stays and a token line follows it: the edit still applies
                # after it was applied, so applying it twice leaves its token twice.
                old = rng.choice(candidates)
                args = {"path": path, "old_text": old, "new_text": f"{old}{token}-e\n"}
                return ToolCall(cid, "edit", args)
        prefix = f"sleep {self.sleep:g} && " if self.sleep > 0 else ""
        if self.gate is not None:
            prefix += f"while [ ! -e '{self.gate}' ]; do sleep 0.01; done && "
        command = f"{prefix}printf '%s\\n' '{token}' >> {JOURNAL}"
        return ToolCall(cid, "bash", {"command": command})

    @staticmethod
    def interpret_bash(command: str) -> tuple[str, str] | None:
        """(path, line) that a scripted bash call appends, or None (documentation aid)."""
        m = _BASH.match(command)
        return (m.group(2), m.group(1)) if m else None


# --- an OpenAI-compatible chat model -------------------------------------------------------


def to_openai_messages(entries: Sequence[Entry], system: str | None) -> list[dict[str, Any]]:
    """The transcript as chat messages: user, assistant (with tool calls), tool."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for e in entries:
        if e.kind == "user":
            out.append({"role": "user", "content": e.data["content"]})
        elif e.kind == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": e.data.get("content") or ""}
            if e.data.get("tool_calls"):
                msg["tool_calls"] = [
                    {
                        "id": tc["id"],
                        "type": "function",
                        "function": {"name": tc["name"], "arguments": json.dumps(tc["args"])},
                    }
                    for tc in e.data["tool_calls"]
                ]
            out.append(msg)
        elif e.kind == "tool_result":
            text = e.data["content"]
            if e.data["status"] != "ok":
                text = f"[{e.data['status']}] {text}"
            out.append({"role": "tool", "tool_call_id": e.data["call_id"], "content": text})
    return out


class OpenAIModel:
    """A chat-completions model (``openai.AsyncOpenAI``; base URL and key default to
    ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``). Tools become function tools."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        **params: Any,
    ) -> None:
        from openai import AsyncOpenAI

        self.model = model
        self.params = params
        self.client = AsyncOpenAI(base_url=base_url, api_key=api_key)

    async def generate(
        self, messages: Sequence[Entry], tools: Sequence[Tool], system: str | None
    ) -> AssistantMessage:
        kwargs: dict[str, Any] = dict(self.params)
        if tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
        chat: Any = to_openai_messages(messages, system)  # plain dicts, as the API takes
        resp = await self.client.chat.completions.create(model=self.model, messages=chat, **kwargs)
        msg = resp.choices[0].message
        calls = [
            ToolCall(tc.id, tc.function.name, parse_json(tc.function.arguments or "{}", where=ARGS))
            for tc in (msg.tool_calls or [])
            if tc.type == "function"
        ]
        return AssistantMessage(msg.content or "", calls)
