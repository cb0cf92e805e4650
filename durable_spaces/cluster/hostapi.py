"""The host agent's small HTTP API, and its client: how coordinators and drivers ask a
host about the Spaces it provides (the reference's HostSpacesService, in JSON).

Three requests, all safe to repeat and all checked against the store by the host:

- ``POST /v1/place {"space", "generation"}``: provide that generation of a durable Space
  (create the sandbox, record the placement in the store). Answers the address; the Space's
  token goes from the host to the store directly, never through the caller. A generation
  that is not waiting for placement is refused (409): nobody can make a host take a Space
  the store did not put up for placement.
- ``POST /v1/rotate {"space", "generation", "lease"}``: give the Space's daemon a new
  access token for lease token ``lease``, the Space's current one (the old token is refused
  from then on), and record it in the store for that lease's holder only; a daemon
  floor above the epoch the store issued with that lease is taken back to it. A lease
  that is not the current one is refused (409).
- ``GET /v1/spaces/<name>?generation=N``: ``up`` (with the daemon's boot identity, which
  changes with every start), ``down`` (the sandbox exists, its daemon does not answer),
  ``gone`` (the sandbox was removed: the host has reported it to the store) or
  ``unknown`` (this host does not provide that generation). Read-only but for the report.

Every request is signed with the cluster's host secret (``hostauth.py``); anything else
is refused with 401 before it is looked at. The server serves from a bounded pool of
``workers`` threads; a connection waits its turn in a queue of at most ``queued`` (more
are closed at once), each read on a socket waits at most ``request_timeout`` and the
request (headers and body) must arrive whole within it (a client that stops sending, or
trickles, loses its connection, not a thread), one request per connection. Errors are
JSON ``{"error": ...}``, one line, with 400 (bad request: a malformed header, body or
number), 401 (not signed by the cluster), 404 (no such Space or resource), 409
(conflict), 503 (anything else: try again).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import socketserver
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol
from urllib.parse import parse_qs, quote, urlsplit

from durable_spaces.cluster.address import check_endpoint
from durable_spaces.cluster.hostauth import HostSecret, sign, verify
from durable_spaces.cluster.records import check_name
from durable_spaces.errors import (
    ClusterConflictError,
    ConfigError,
    DurableSpacesError,
    HostApiError,
    HostAuthError,
    UnknownRecordError,
)
from durable_spaces.host.bounded import parse_json

STATES = ("up", "down", "gone", "unknown")
_MAX_BODY = 64 * 1024
#: A generation is a PostgreSQL integer (``durable_spaces/cluster/schema.py``).
MAX_GENERATION = 2**31 - 1
#: A lease token is a bigint.
MAX_LEASE = 2**63 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")
REQUEST_TIMEOUT = 10.0
WORKERS = 16
QUEUED = 64


class HostService(Protocol):
    """What the API serves (``durable_spaces/cluster/host.py``'s ``HostAgent``)."""

    def accepted_secrets(self) -> Sequence[HostSecret]: ...

    def place(self, space: str, generation: int) -> dict[str, Any]: ...

    def rotate(self, space: str, generation: int, lease: int) -> dict[str, Any]: ...

    def status(self, space: str, generation: int) -> dict[str, Any]: ...


def _number(what: str, value: object, lo: int, hi: int) -> int:
    """``value`` (a JSON number or a query's text) as an int in lo..hi; ConfigError."""
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{what} must be an integer in {lo}..{hi}")
    return value


def _small_int(text: str) -> int:
    """JSON integers, refused before conversion when longer than any field can be."""
    if len(text.lstrip("-")) > 19:
        raise ValueError("a number is too long")
    return int(text)


def _status_for(e: BaseException) -> HTTPStatus:
    if isinstance(e, HostAuthError):
        return HTTPStatus.UNAUTHORIZED
    if isinstance(e, ConfigError):
        return HTTPStatus.BAD_REQUEST
    if isinstance(e, ClusterConflictError):
        return HTTPStatus.CONFLICT
    if isinstance(e, UnknownRecordError):
        return HTTPStatus.NOT_FOUND
    return HTTPStatus.SERVICE_UNAVAILABLE


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout)  # every read waits this
        self.server.reading(self.connection)  # and the whole request, headers too

    def log_message(self, format: str, *args: Any) -> None:
        return  # requests are not logged (the host's log is its events)

    def _answer(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.close_connection = True  # one request per connection: no idle worker
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        if not _DIGITS.fullmatch(raw.strip()):
            raise ConfigError("Content-Length must be a decimal integer")
        length = int(raw.strip())
        if length > _MAX_BODY:
            raise ConfigError(f"a request's body is at most {_MAX_BODY} bytes")
        deadline = time.monotonic() + self.server.request_timeout
        chunks: list[bytes] = []
        got = 0
        while got < length:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the body did not arrive in time")
            self.connection.settimeout(left)
            chunk = self.rfile.read1(length - got)
            if not chunk:
                raise ConfigError("the body ended before its Content-Length")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _serve(self, method: str, route: Callable[[bytes], dict[str, Any]]) -> None:
        try:
            body = self._body()
            self.server.read(self.connection)  # serving may take long (a sandbox's start)
            verify(
                self.headers.get("Authorization"),
                self.server.service.accepted_secrets(),
                method,
                self.path,
                body,
            )
            self._answer(HTTPStatus.OK, route(body))
        except (TimeoutError, ConnectionError):
            self.close_connection = True  # the client is too slow or gone: no answer
        except DurableSpacesError as e:
            self._answer(_status_for(e), {"error": _one_line(f"{type(e).__name__}: {e}")})
        except Exception as e:  # the host must answer something; the caller retries
            self._answer(
                HTTPStatus.SERVICE_UNAVAILABLE, {"error": _one_line(f"{type(e).__name__}: {e}")}
            )

    def _not_found(self) -> dict[str, Any]:
        raise UnknownRecordError(f"no such resource {urlsplit(self.path).path!r}")

    def do_GET(self) -> None:
        def route(body: bytes) -> dict[str, Any]:
            parts = urlsplit(self.path)
            segs = parts.path.split("/")
            if len(segs) != 4 or segs[:3] != ["", "v1", "spaces"]:
                return self._not_found()
            gens = parse_qs(parts.query).get("generation", [""])
            gen = _number("generation", gens[0], 1, MAX_GENERATION)
            return self.server.service.status(check_name("space", segs[3]), gen)

        self._serve("GET", route)

    def do_POST(self) -> None:
        def route(body: bytes) -> dict[str, Any]:
            if self.path not in ("/v1/place", "/v1/rotate"):
                return self._not_found()
            try:
                req = parse_json(body, where="a request", parse_int=_small_int) if body else None
            except ValueError:
                req = None
            if not isinstance(req, dict):
                raise ConfigError("a request's body must be a JSON object")
            space = check_name("space", req.get("space"))
            gen = _number("generation", req.get("generation"), 1, MAX_GENERATION)
            if self.path == "/v1/place":
                return self.server.service.place(space, gen)
            lease = _number("lease", req.get("lease"), 1, MAX_LEASE)
            return self.server.service.rotate(space, gen, lease)

        self._serve("POST", route)


class _Server(socketserver.TCPServer):
    """Connections served by a bounded pool (module doc), never a thread each."""

    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog; the pool's own queue is ``queued``

    def __init__(
        self,
        endpoint: tuple[str, int],
        service: HostService,
        *,
        workers: int,
        queued: int,
        request_timeout: float,
    ) -> None:
        self.service = service
        self.request_timeout = request_timeout
        self._queued = queued
        self._pending = 0
        self._count = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="ds-host-api")
        #: Connections still sending their request, and when they must have sent it.
        self._reading: dict[socket.socket, float] = {}
        self._stop = threading.Event()
        super().__init__(endpoint, _Handler)
        threading.Thread(target=self._cut_slow, name="ds-host-api-reaper", daemon=True).start()

    def reading(self, conn: socket.socket) -> None:
        with self._count:
            self._reading[conn] = time.monotonic() + self.request_timeout

    def read(self, conn: socket.socket) -> None:
        with self._count:
            self._reading.pop(conn, None)

    def _cut_slow(self) -> None:
        """A client trickling its request a byte at a time passes every read's timeout:
        its connection is shut once the request as a whole is late (the read then ends)."""
        while not self._stop.wait(self.request_timeout / 4):
            now = time.monotonic()
            with self._count:
                late = [c for c, deadline in self._reading.items() if deadline < now]
                for c in late:
                    del self._reading[c]
            for c in late:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._count:
            full = self._pending >= self._queued
            if not full:
                self._pending += 1
        if full:
            self.shutdown_request(request)  # over the bound: closed, not queued
            return
        self._pool.submit(self._work, request, client_address)

    def _work(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.read(request)
            self.shutdown_request(request)
            with self._count:
                self._pending -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a client that broke its connection: nothing to tell anyone

    def server_close(self) -> None:
        self._stop.set()
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class HostApiServer:
    """Serves ``service`` on ``address`` (``ip:port``) from a bounded pool of threads."""

    def __init__(
        self,
        address: str,
        service: HostService,
        *,
        workers: int = WORKERS,
        queued: int = QUEUED,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self._server = _Server(
            check_endpoint("host address", address),
            service,
            workers=workers,
            queued=queued,
            request_timeout=request_timeout,
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ds-host-api", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class HostClient:
    """Asks one host agent (at ``address``, ``ip:port``) about its Spaces."""

    def __init__(self, address: str, secret: HostSecret, *, timeout: float = 2.0) -> None:
        check_endpoint("host address", address)
        self.address = address
        self.timeout = timeout
        self._secret = secret

    def __repr__(self) -> str:
        return f"HostClient({self.address!r})"

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float
    ) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://{self.address}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", sign(self._secret, method, path, data or b""))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                out = parse_json(r.read(_MAX_BODY + 1), where=f"host {self.address}")
        except urllib.error.HTTPError as e:
            try:
                why = str(parse_json(e.read(_MAX_BODY), where="").get("error", e.reason))
            except (ValueError, AttributeError):
                why = str(e.reason)
            if e.code == HTTPStatus.CONFLICT:
                raise ClusterConflictError(f"host {self.address}: {why}") from None
            if e.code == HTTPStatus.BAD_REQUEST:
                raise ConfigError(f"host {self.address}: {why}") from None
            if e.code == HTTPStatus.UNAUTHORIZED:
                raise HostAuthError(f"host {self.address}: {why}") from None
            if e.code == HTTPStatus.NOT_FOUND:
                raise UnknownRecordError(f"host {self.address}: {why}") from None
            raise HostApiError(f"host {self.address} answered {e.code}: {why}") from None
        except (OSError, ValueError) as e:  # refused, unreachable, timed out, not JSON
            raise HostApiError(f"host {self.address} did not answer: {e}") from None
        if not isinstance(out, dict):
            raise HostApiError(f"host {self.address} answered something other than an object")
        return out

    def place(self, space: str, generation: int, *, timeout: float = 120.0) -> dict[str, Any]:
        """Have the host provide ``generation`` of ``space``; its answer (``address``)."""
        body = {"space": check_name("space", space), "generation": generation}
        return self._request("POST", "/v1/place", body, timeout)

    def rotate(self, space: str, generation: int, lease: int) -> dict[str, Any]:
        """Have the host give the Space's daemon a new token for lease ``lease``."""
        body = {"space": check_name("space", space), "generation": generation, "lease": lease}
        return self._request("POST", "/v1/rotate", body, 120.0)

    def status(self, space: str, generation: int) -> dict[str, Any]:
        """``{"state": up|down|gone|unknown, "boot": ...}`` for that generation."""
        path = f"/v1/spaces/{quote(check_name('space', space), safe='')}?generation={generation}"
        out = self._request("GET", path, None, self.timeout)
        if out.get("state") not in STATES:
            raise HostApiError(f"host {self.address}: unknown space state {out.get('state')!r}")
        return out


__all__ = ["STATES", "HostApiServer", "HostClient", "HostService"]
