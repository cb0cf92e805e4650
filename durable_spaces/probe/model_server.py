"""The scripted model: OpenAI Chat Completions on 127.0.0.1, plain JSON and SSE.

It decides its next answer from what the request shows it (shown.py), wherever shown (a
tool message, a user message summarising earlier calls): it asks for the first step it
has not yet seen done, as the tool's own output or as the harness's declared report of an
interruption (the recipe's ``[report]``). A step shown only a result without that
evidence (a report in words it was not told, or a made-up success) is asked for again,
as a careful model would, at most ``MAX_ASKS`` times. It never asks again for a step it
saw done, so when the harness shows what it did, a second effect of one of the model's
calls is the harness's doing (the checker tells the two apart by the answer each effect
names, task.py). After the last step it answers text and the harness must finish.

Tool call ids are new at every answer, a pure function of the run's seed and the
answer's index (``per_step``: the older ids, the step's own, task.py's ``Step.call_id``).
Every request is recorded (body, the step asked for, the call's id, and how it was
answered) for the checker. What it cannot answer (another endpoint, a request without the
recipe's tool, a flood of requests) it refuses with an HTTP error and keeps as a
``problem`` the probe reports in one line.

Model-side points: an armed point (``arm``) is hit once, the first time request k arrives
(``request``) or answer k is half sent (``stream``); ``reached`` is called, then per fault
the server holds the answer until ``release`` (a kill), answers HTTP 500, cuts the answer
(closes the connection), or answers late.
"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from durable_spaces.host.bounded import parse_json
from durable_spaces.probe.gates import GatePoint
from durable_spaces.probe.recipe import Recipe
from durable_spaces.probe.shown import view
from durable_spaces.probe.task import Step

__all__ = ["MAX_ASKS", "MODEL", "ModelServer", "next_step"]

MODEL = "probe-model"
MAX_BODY = 8 << 20
MAX_REQUESTS = 200
#: How often the model asks for one step before it moves on all the same.
MAX_ASKS = 3
#: How late a ``model-slow`` answer comes.
SLOW_S = 2.0


def next_step(body: Any, steps: Sequence[Step], issued: Mapping[str, int], recipe: Recipe,
              baseline: Mapping[int, str] | None, swaps: Mapping[str, str],
              asks: Mapping[int, int]) -> int:  # fmt: skip
    """The step the model asks for, seeing ``body``: the first it has not seen done (its
    output, or the harness's report) and has asked for fewer than ``MAX_ASKS`` times;
    past the last step, the final answer (``len(steps) + 1``)."""
    seen = view(body, steps, issued, recipe.report, baseline, swaps)
    for s in steps:
        v = seen.get(s.k)
        if (v is None or not (v.output or v.reported)) and asks.get(s.k, 0) < MAX_ASKS:
            return s.k
    return len(steps) + 1


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
    def __init__(self, steps: Sequence[Step], recipe: Recipe, gates: Path, seed: str = "",
                 per_step: bool = False, baseline: Mapping[int, str] | None = None,
                 swaps: Mapping[str, str] | None = None,
                 effects: str | None = None) -> None:  # fmt: skip
        self.steps = list(steps)
        self.effects = effects  # the effect server's URL (task.Step.command)
        self.recipe = recipe
        self.gates = gates
        self.seed = seed
        self.per_step = per_step
        self.baseline = baseline
        self.swaps: dict[str, str] = dict(swaps or {})
        self.issued: dict[str, int] = {}  # call id -> step
        self.asks: Counter[int] = Counter()
        self.nonce = self.steps[0].nonce if self.steps else "00000000"
        self.requests: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.point: GatePoint | None = None
        self.fault = ""
        self.reached: Callable[[GatePoint], None] = lambda p: None
        self.hit_at: float | None = None
        self._release = threading.Event()
        self._lock = threading.Lock()
        self.t0 = time.monotonic()
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
            entry["t_ms"] = round((time.monotonic() - self.t0) * 1000, 1)
            self.requests.append(entry)

    def wait_release(self) -> None:
        self._release.wait()

    def decide(self, body: Any) -> int:
        with self._lock:
            return next_step(body, self.steps, self.issued, self.recipe, self.baseline,
                             self.swaps, self.asks)  # fmt: skip

    def call_for(self, k: int, n: int) -> tuple[str, str]:
        """The id and the answer tag of the call asking for step ``k`` in answer ``n``."""
        step = self.steps[k - 1]
        cid = step.call_id(self.seed, n, self.per_step)
        with self._lock:
            self.issued[cid] = k
            self.swaps[cid] = "<id>"
            self.asks[k] += 1
        return cid, "" if self.per_step else f"a{n}"

    def answer(self, k: int, stream: bool, cid: str = "",
               tag: str = "") -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
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
            name, args = step.arguments(self.recipe, self.gates, tag, self.effects)
            call = {"id": cid, "type": "function",
                    "function": {"name": name, "arguments": args}}  # fmt: skip
            msg = {"role": "assistant", "content": None, "tool_calls": [call]}
            half = len(args) // 2
            chunks = [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"index": 0, "id": cid, "type": "function",
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
        k = m.decide(body)
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
        cid, tag = m.call_for(k, entry["n"]) if k <= len(m.steps) else ("", "")
        if cid:
            entry["call_id"] = cid
        whole, events = m.answer(k, stream, cid, tag)
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
            self.wfile.flush()
            entry["answered"] = True
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
        self.wfile.flush()
        entry["answered"] = True

    def _cut(self, entry: dict[str, Any]) -> None:
        m = self.model
        entry["answer"] = f"fault:{m.fault}"
        if m.fault != "model-cut":
            m.wait_release()
        self.close_connection = True
        self.connection.close()
