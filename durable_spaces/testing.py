"""Helpers for testing code built on durable-spaces (shipped with the library, like
``trio.testing``): the deterministic scripted model, the workspace its transcript implies,
and a tiny OpenAI-compatible chat server on 127.0.0.1 that answers from a script.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from durable_spaces.harness.models import (
    AssistantMessage,
    ScriptedModel,
    ToolCall,
    implied_workspace,
)

if TYPE_CHECKING:
    from durable_spaces.harness.handles import Conversation
    from durable_spaces.harness.scheduler import Harness

__all__ = [
    "CallListModel",
    "FakeOpenAIServer",
    "ScriptedModel",
    "fake_openai_server",
    "implied_workspace",
    "run_call_list",
    "text_reply",
    "tool_call_reply",
]


class CallListModel:
    """A model that asks for the given tool calls, one per step (step ``n`` is the number of
    results in the transcript, so a resumed run asks for the same next call), then answers
    ``"done"``. For testing a tool's handling of exactly the arguments a test chooses,
    however malformed."""

    def __init__(self, calls: Sequence[tuple[str, Any]]) -> None:
        self.calls = list(calls)

    async def generate(self, messages: Sequence[Any], tools: Sequence[Any], system: Any) -> Any:
        step = sum(1 for e in messages if e.kind == "tool_result")
        if step >= len(self.calls):
            return AssistantMessage("done")
        name, args = self.calls[step]
        return AssistantMessage(f"step {step}", [ToolCall(f"call-{step}", name, args)])


async def run_call_list(
    harness: Harness, model: str = "m", timeout: float = 120
) -> tuple[Conversation, list[dict[str, Any]]]:
    """The root conversation (created on ``model``, a ``CallListModel`` say) run to its
    end: the conversation and its tool results' data, in order."""
    from durable_spaces.harness.scheduler import AgentConfig

    conv = await harness.root(AgentConfig(model=model))
    sub = await conv.submit("go", request_id="r")
    done = await asyncio.wait_for(sub.wait(), timeout)
    assert done.status == "done", done
    return conv, [e.data for e in conv.entries() if e.kind == "tool_result"]


def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "fake",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def text_reply(text: str) -> dict[str, Any]:
    """A chat completion that answers ``text`` with no tool calls."""
    return _completion({"role": "assistant", "content": text}, "stop")


def tool_call_reply(name: str, args: dict[str, Any], call_id: str = "call_1") -> dict[str, Any]:
    """A chat completion that calls one function tool."""
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
    return _completion({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls")


class FakeOpenAIServer:
    """Serves ``POST /v1/chat/completions`` from a list of replies, in order (the last one
    repeats), and records each request body in ``requests``."""

    def __init__(self, replies: Sequence[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)))
                if not self.path.endswith("/chat/completions"):
                    self.send_error(404)
                    return
                server.requests.append(body)
                reply = server.replies[min(len(server.requests), len(server.replies)) - 1]
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@contextmanager
def fake_openai_server(replies: Sequence[dict[str, Any]]) -> Iterator[FakeOpenAIServer]:
    """``with fake_openai_server([...]) as srv: OpenAIModel("m", base_url=srv.base_url, ...)``"""
    srv = FakeOpenAIServer(replies).start()
    try:
        yield srv
    finally:
        srv.stop()
