"""The scripted model: OpenAI Chat Completions on 127.0.0.1, plain JSON and SSE.

Its next action is a pure function of the request (``decide``): one past the last step
whose tool call the request's history holds, whatever that call's result says. So it moves
on from a step whose result is an error or a made-up text and never asks for a step twice:
every duplicate effect is the harness's doing, and a resent request is answered as it was.
Tool call ids are the steps' own (deterministic). After the last step it answers text and
the harness must finish.

Every request is recorded (body and what was answered) for the checker. What it cannot
answer (another endpoint, a request without the recipe's tool, a flood of requests) it
refuses with an HTTP error and keeps as a ``problem`` the probe reports in one line.

Model-side points: an armed point (``arm``) is hit once, the first time request k arrives
(``request``) or answer k is half sent (``stream``); ``reached`` is called, then per fault
the server holds the answer until ``release`` (a kill), answers HTTP 500, cuts the answer
(closes the connection), or answers late.
"""

from __future__ import annotations

import json
import re
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from durable_spaces.host.bounded import parse_json
from durable_spaces.probe.gates import GatePoint
from durable_spaces.probe.recipe import Recipe
from durable_spaces.probe.task import Step

__all__ = ["MODEL", "ModelServer", "content_text", "decide"]

MODEL = "probe-model"
MAX_BODY = 8 << 20
MAX_REQUESTS = 200
#: How late a ``model-slow`` answer comes.
SLOW_S = 2.0
_ID = re.compile(r"call_([0-9a-f]{8})_(\d{1,4})")


def content_text(content: Any) -> str:
    """A message's content as text (a string, or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content)


def calls_in(messages: Sequence[Any], nonce: str) -> dict[str, int]:
    """The request's tool calls of this run's steps: call id -> step. A call whose id the
    harness rewrote is known by the token in its arguments."""
    token = re.compile(rf"p{nonce}\W*s(\d{{1,4}})")
    out: dict[str, int] = {}
    for m in messages:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        for c in m.get("tool_calls") or ():
            if not isinstance(c, dict):
                continue
            cid = str(c.get("id", ""))
            hit = _ID.fullmatch(cid)
            if hit and hit.group(1) == nonce:
                out[cid] = int(hit.group(2))
                continue
            fn = c.get("function")
            found = token.search(str(fn.get("arguments", ""))) if isinstance(fn, dict) else None
            if found:
                out[cid] = int(found.group(1))
    return out


def decide(body: Any, nonce: str) -> int:
    """The step request ``body`` asks for: one past the last step its history called."""
    messages = body.get("messages") if isinstance(body, dict) else None
    seen = calls_in(messages if isinstance(messages, list) else [], nonce)
    return max(seen.values(), default=0) + 1


def tool_names(body: Any) -> list[str]:
    """The names of the tools a request offers the model."""
    out = []
    listed = body.get("tools") if isinstance(body, dict) else None
    for t in listed if isinstance(listed, list) else ():
        if not isinstance(t, dict):
            continue
        fn = t.get("function")
        name = fn.get("name") if isinstance(fn, dict) else t.get("name")
        if isinstance(name, str):
            out.append(name)
    return out


class _ModelServer(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer's own asks the resolver for the host's name (getfqdn): milliseconds
        # a run would pay for a name nobody reads.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


class ModelServer:
    def __init__(self, steps: Sequence[Step], recipe: Recipe, gates: Path) -> None:
        self.steps = list(steps)
        self.recipe = recipe
        self.gates = gates
        self.nonce = self.steps[0].nonce if self.steps else "00000000"
        self.requests: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.point: GatePoint | None = None
        self.fault = ""
        self.reached: Callable[[GatePoint], None] = lambda p: None
        self.hit_at: float | None = None
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        server = self

        class ServedHandler(_ModelHandler):
            model = server

        self._httpd = _ModelServer(("127.0.0.1", 0), ServedHandler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.01})  # fmt: skip
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def arm(
        self, point: GatePoint | None, fault: str, reached: Callable[[GatePoint], None]
    ) -> None:
        self.point, self.fault, self.reached = point, fault, reached

    def release(self) -> None:
        """Let a held answer go: its connection is closed unanswered (the kill came)."""
        self._release.set()

    def close(self) -> None:
        """Stop serving. The serving loop notices within its poll interval; the run does
        not wait for it (its requests are all recorded by now)."""
        self._release.set()

        def stop() -> None:
            self._httpd.shutdown()
            self._httpd.server_close()

        threading.Thread(target=stop, daemon=True).start()

    def problem(self, text: str) -> None:
        with self._lock:
            if text not in self.problems:
                self.problems.append(text)

    def take(self, point: GatePoint) -> bool:
        """True once: when ``point`` is the armed one (the first time it is reached)."""
        with self._lock:
            if self.point != point or self.hit_at is not None:
                return False
            self.hit_at = time.monotonic()
        self.reached(point)
        return True

    def record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            entry["n"] = len(self.requests)
            entry["t_ms"] = round((time.monotonic() - self._t0) * 1000, 1)
            self.requests.append(entry)

    def wait_release(self) -> None:
        self._release.wait()

    def answer(self, k: int, stream: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Answer k as one JSON object and as its stream chunks."""
        base = {"id": f"chatcmpl-{self.nonce}-{k}", "created": 0, "model": MODEL}
        usage = {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
        chunks: list[dict[str, Any]]
        if k > len(self.steps):
            text = "All steps are done."
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            chunks = [{"role": "assistant", "content": ""}, {"content": text}]
            finish = "stop"
        else:
            step = self.steps[k - 1]
            name, args = step.arguments(self.recipe, self.gates)
            call = {"id": step.call_id, "type": "function",
                    "function": {"name": name, "arguments": args}}  # fmt: skip
            msg = {"role": "assistant", "content": None, "tool_calls": [call]}
            half = len(args) // 2
            chunks = [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"index": 0, "id": step.call_id, "type": "function",
                     "function": {"name": name, "arguments": ""}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": args[:half]}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": args[half:]}}]},
            ]  # fmt: skip
            finish = "tool_calls"
        whole = {**base, "object": "chat.completion", "usage": usage,
                 "choices": [{"index": 0, "message": msg, "finish_reason": finish,
                              "logprobs": None}]}  # fmt: skip
        events = [
            {**base, "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": d, "finish_reason": None, "logprobs": None}]}
            for d in chunks
        ]  # fmt: skip
        events.append({**base, "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": {}, "finish_reason": finish,
                                    "logprobs": None}]})  # fmt: skip
        events.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        return whole, events


class _ModelHandler(BaseHTTPRequestHandler):
    model: ModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, text: str) -> None:
        self._json(status, {"error": {"message": text, "type": "probe", "code": status}})

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "probe"}],
                },
            )
            return
        self.model.problem(f"the harness asked GET {self.path[:80]}; the scripted model "
                           "answers only POST /v1/chat/completions and GET /v1/models")  # fmt: skip
        self._error(404, "not here")

    def do_POST(self) -> None:
        m = self.model
        path = self.path.split("?")[0].rstrip("/")
        size = int(self.headers.get("Content-Length") or 0)
        if not 0 <= size <= MAX_BODY:
            self.close_connection = True
            self._error(413, "too large")
            return
        raw = self.rfile.read(size)
        entry: dict[str, Any] = {"path": path}
        if path != "/v1/chat/completions":
            m.problem(f"the harness asked POST {path[:80]}; the scripted model answers only "
                      "Chat Completions (POST /v1/chat/completions)")  # fmt: skip
            m.record({**entry, "answer": "refused"})
            self._error(404, "the probe's model answers only /v1/chat/completions")
            return
        try:
            body = parse_json(raw, where="a request")
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            m.problem("the harness sent a chat completion request without a messages list")
            m.record({**entry, "answer": "refused"})
            self._error(400, "messages missing")
            return
        k = decide(body, m.nonce)
        stream = bool(body.get("stream"))
        entry.update(body=body, step=k, stream=stream)
        if len(m.requests) >= MAX_REQUESTS:
            m.problem(f"the harness sent more than {MAX_REQUESTS} model requests in one run")
            m.record({**entry, "body": None, "answer": "refused"})
            self._error(429, "too many requests")
            return
        if k <= len(m.steps):
            want = m.steps[k - 1].arguments(m.recipe, m.gates)[0]
            offered = tool_names(body)
            if want not in offered:
                m.problem(
                    f"the harness offers the model the tools [{', '.join(offered)}]: the "
                    f"recipe's tool {want!r} is not among them"
                )
                m.record({**entry, "answer": "refused"})
                self._error(400, f"tool {want} not offered")
                return
        m.record(entry)
        if m.take(GatePoint(k, "request")):
            entry["answer"] = f"fault:{m.fault}"
            if m.fault == "model-5xx":
                self._error(500, "injected server error")
                return
            if m.fault == "model-slow":
                time.sleep(SLOW_S)
            else:
                m.wait_release()
                self.close_connection = True
                return
        whole, events = m.answer(k, stream)
        entry.setdefault("answer", "final" if k > len(m.steps) else "tool")
        point = GatePoint(k, "stream")
        if not stream:
            data = json.dumps(whole).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            half = len(data) // 2 if point == m.point else 0
            self.wfile.write(data[:half])
            self.wfile.flush()
            if half and m.take(point):
                self._cut(entry)
                return
            self.wfile.write(data[half:])
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for i, ev in enumerate(events):
            if i == 2 and m.take(point):  # the call's name sent, half its arguments
                self.wfile.flush()
                self._cut(entry)
                return
            self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def _cut(self, entry: dict[str, Any]) -> None:
        m = self.model
        entry["answer"] = f"fault:{m.fault}"
        if m.fault != "model-cut":
            m.wait_release()
        self.close_connection = True
        self.connection.close()
