"""Helpers for testing code built on durable-spaces (shipped with the library, like
``trio.testing``): the deterministic scripted model, the workspace its transcript implies,
and a tiny OpenAI-compatible chat server on 127.0.0.1 that answers from a script.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from durable_spaces.harness.models import (
    AssistantMessage,
    ScriptedModel,
    ToolCall,
    implied_workspace,
)
from durable_spaces.host.bounded import parse_json

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
    "stream_chunks",
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


def stream_chunks(reply: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A chat completion as the chunks of a streamed answer (``"stream": true``): the
    role, the text, each tool call whole (its index, id, name and arguments), then the
    finish reason and the usage, as OpenAI's SSE stream carries them."""
    base = {k: reply[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    choice = reply["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    if message.get("content"):
        yield chunk({"content": message["content"]})
    for i, call in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, choice["finish_reason"])
    yield {**base, "choices": [], "usage": reply.get("usage")}


Replies = Sequence[dict[str, Any]] | Callable[[dict[str, Any]], dict[str, Any]]


class FakeOpenAIServer:
    """Serves ``POST /v1/chat/completions`` from a list of replies, in order (the last one
    repeats), or from a function of the request body; records each request body in
    ``requests``. A request with ``"stream": true`` gets its reply as an SSE stream
    (``stream_chunks``); ``GET /v1/models`` lists one model, ``fake``."""

    def __init__(self, replies: Replies) -> None:
        self.replies = replies if callable(replies) else list(replies)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as SDK clients expect

            def do_GET(self) -> None:
                if not self.path.endswith("/models"):
                    self.send_error(404)
                    return
                self._send_json({"object": "list", "data": [{"id": "fake", "object": "model"}]})

            def do_POST(self) -> None:
                size = int(self.headers["Content-Length"] or 0)
                body = parse_json(self.rfile.read(size), where="a request")
                if not self.path.endswith("/chat/completions"):
                    self.send_error(404)
                    return
                with server._lock:
                    server.requests.append(body)
                    reply = server._reply(body)
                if body.get("stream"):
                    self._send_stream(reply)
                else:
                    self._send_json(reply)

            def _send_json(self, reply: dict[str, Any]) -> None:
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _send_stream(self, reply: dict[str, Any]) -> None:
                events = [f"data: {json.dumps(c)}\n\n" for c in stream_chunks(reply)]
                data = "".join([*events, "data: [DONE]\n\n"]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def _reply(self, body: dict[str, Any]) -> dict[str, Any]:
        if callable(self.replies):
            return self.replies(body)
        return self.replies[min(len(self.requests), len(self.replies)) - 1]

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
def fake_openai_server(replies: Replies) -> Iterator[FakeOpenAIServer]:
    """``with fake_openai_server([...]) as srv: OpenAIModel("m", base_url=srv.base_url, ...)``"""
    srv = FakeOpenAIServer(replies).start()
    try:
        yield srv
    finally:
        srv.stop()
