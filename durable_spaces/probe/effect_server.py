"""The effect server: an outside service the task's shell steps call (``--effect-server``).

An effect outside the Space (a payment, a ticket, a message sent) cannot be taken back by
any workspace image: a harness that runs a call again makes it twice unless the request
carries a key the service knows again. The server is HTTP on 127.0.0.1, a thread of the
probe's as the model server is; each shell step's command, right after its effect in the
workspace, POSTs ``/effect/<token>`` with ``curl``, carrying ``Idempotency-Key:
$DS_CALL_KEY`` when the harness gives its commands that variable (durable-spaces'
integrations and harness do: the call's stable key, the same for every attempt).

Counting, per step token: every request with an ``Idempotency-Key`` header counts once
per distinct key (the service's own rule: a repeated key is the same request); every
request without one counts on its own. A key elsewhere (another header's name, a field of
the body) is no key to this service: those requests count each, as a real service that
does not know the field would make each. The checker (``checker.py``) compares the count
with the model's episodes of the step: more is a duplicate; none while the model was shown
the step's output is a lost effect.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["KEY_HEADER", "EffectServer", "count"]

KEY_HEADER = "Idempotency-Key"
#: What the path names: a step's token (task.py: ``p<nonce>s<k>``).
_PATH = re.compile(r"/effect/(p[0-9a-f]{8}s\d{1,4})")
#: The longest key kept (a longer one is cut: two keys that differ only past it count once).
MAX_KEY = 512
#: The most requests one probe run keeps (a harness looping on the step stops being told).
MAX_REQUESTS = 10000
#: The most of a body read (and thrown away).
MAX_BODY = 64 << 10


class _EffectHandler(BaseHTTPRequestHandler):
    server_version = "probe-effects/1"
    effects: EffectServer  # set on the subclass the server makes

    def do_POST(self) -> None:
        m = _PATH.fullmatch(self.path)
        size = self.headers.get("Content-Length") or "0"
        n = int(size) if size.isdigit() else 0
        if n:
            self.rfile.read(min(n, MAX_BODY))
        if m is None:
            self._answer(404, b"no such effect\n")
            return
        key = self.headers.get(KEY_HEADER)
        if not self.effects.record(m.group(1), key[:MAX_KEY] if key else None):
            self._answer(429, b"too many requests\n")
            return
        self._answer(200, b"done\n")

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the probe's output is its SUMMARY line


class EffectServer:
    """One run's effect server: ``url``, the ``requests`` it took, ``close()``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.t0 = time.monotonic()
        effects = self

        class ServedEffects(_EffectHandler):
            pass

        ServedEffects.effects = effects
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), ServedEffects)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.01})  # fmt: skip
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def record(self, token: str, key: str | None) -> bool:
        with self._lock:
            if len(self.requests) >= MAX_REQUESTS:
                return False
            t_ms = round((time.monotonic() - self.t0) * 1000, 1)
            self.requests.append({"token": token, "key": key, "t_ms": t_ms})
            return True

    def counts(self) -> dict[str, int]:
        with self._lock:
            return count(self.requests)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def count(requests: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Effects per token (module docstring): distinct keys, plus every unkeyed request."""
    keys: dict[str, set[str]] = {}
    out: dict[str, int] = {}
    for r in requests:
        token, key = str(r["token"]), r.get("key")
        if key is None:
            out[token] = out.get(token, 0) + 1
        elif str(key) not in keys.setdefault(token, set()):
            keys[token].add(str(key))
            out[token] = out.get(token, 0) + 1
    return out
