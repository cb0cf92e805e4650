"""The host agent's small HTTP API, and its client: how coordinators and drivers ask a
host about the Spaces it provides (the reference's HostSpacesService, in JSON).

Two requests, both safe to repeat and both checked against the store by the host:

- ``POST /v1/place {"space", "generation"}``: provide that generation of a durable Space
  (create the sandbox, record the placement in the store). Answers the address; the Space's
  token goes from the host to the store directly, never through the caller. A generation
  that is not waiting for placement is refused (409): nobody can make a host take a Space
  the store did not put up for placement.
- ``GET /v1/spaces/<name>?generation=N``: ``up`` (with the daemon's boot identity, which
  changes with every start), ``down`` (the sandbox exists, its daemon does not answer),
  ``gone`` (the sandbox was removed: the host has reported it to the store) or
  ``unknown`` (this host does not provide that generation). Read-only but for the report.

No request carries a secret and none can take a Space from its holder, so the API has no
authentication of its own; keep it on the cluster's network (see the README's cluster
section). Errors are JSON ``{"error": ...}`` with 400 (bad request), 404 (no such Space
or resource), 409 (conflict), 503 (anything else: try again).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, quote, urlsplit

from durable_spaces.cluster.address import check_endpoint
from durable_spaces.cluster.records import check_int, check_name
from durable_spaces.errors import (
    ClusterConflictError,
    ConfigError,
    DurableSpacesError,
    HostApiError,
    UnknownRecordError,
)

STATES = ("up", "down", "gone", "unknown")
_MAX_BODY = 64 * 1024


class HostService(Protocol):
    """What the API serves (``durable_spaces/cluster/host.py``'s ``HostAgent``)."""

    def place(self, space: str, generation: int) -> dict[str, Any]: ...

    def status(self, space: str, generation: int) -> dict[str, Any]: ...


def _status_for(e: BaseException) -> HTTPStatus:
    if isinstance(e, ConfigError):
        return HTTPStatus.BAD_REQUEST
    if isinstance(e, ClusterConflictError):
        return HTTPStatus.CONFLICT
    if isinstance(e, UnknownRecordError):
        return HTTPStatus.NOT_FOUND
    return HTTPStatus.SERVICE_UNAVAILABLE


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return  # requests are not logged (the host's log is its events)

    def _answer(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, fn: Callable[[], dict[str, Any]]) -> None:
        try:
            self._answer(HTTPStatus.OK, fn())
        except DurableSpacesError as e:
            self._answer(_status_for(e), {"error": f"{type(e).__name__}: {e}"})
        except Exception as e:  # the host must answer something; the caller retries
            self._answer(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"{type(e).__name__}: {e}"})

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        segs = parts.path.split("/")
        if len(segs) != 4 or segs[:3] != ["", "v1", "spaces"]:
            self._answer(HTTPStatus.NOT_FOUND, {"error": f"no such resource {parts.path!r}"})
            return

        def status() -> dict[str, Any]:
            gen = parse_qs(parts.query).get("generation", [""])[0]
            if not gen.isdigit():
                raise ConfigError("generation must be a non-negative integer")
            return self.server.service.status(check_name("space", segs[3]), int(gen))

        self._serve(status)

    def do_POST(self) -> None:
        if self.path != "/v1/place":
            self._answer(HTTPStatus.NOT_FOUND, {"error": f"no such resource {self.path!r}"})
            return

        def place() -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= _MAX_BODY:
                raise ConfigError("a place request needs a JSON body")
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError as e:
                raise ConfigError(f"a place request's body is not JSON: {e}") from None
            if not isinstance(body, dict):
                raise ConfigError("a place request's body must be a JSON object")
            space = check_name("space", body.get("space"))
            return self.server.service.place(space, check_int("generation", body.get("generation")))

        self._serve(place)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, endpoint: tuple[str, int], service: HostService) -> None:
        self.service = service
        super().__init__(endpoint, _Handler)


class HostApiServer:
    """Serves ``service`` on ``address`` (``ip:port``) from threads of its own."""

    def __init__(self, address: str, service: HostService) -> None:
        self._server = _Server(check_endpoint("host address", address), service)
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

    def __init__(self, address: str, *, timeout: float = 2.0) -> None:
        check_endpoint("host address", address)
        self.address = address
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"HostClient({self.address!r})"

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float
    ) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://{self.address}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            try:
                why = str(json.loads(e.read()).get("error", e.reason))
            except ValueError:
                why = str(e.reason)
            if e.code == HTTPStatus.CONFLICT:
                raise ClusterConflictError(f"host {self.address}: {why}") from None
            if e.code == HTTPStatus.BAD_REQUEST:
                raise ConfigError(f"host {self.address}: {why}") from None
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

    def status(self, space: str, generation: int) -> dict[str, Any]:
        """``{"state": up|down|gone|unknown, "boot": ...}`` for that generation."""
        path = f"/v1/spaces/{quote(check_name('space', space), safe='')}?generation={generation}"
        out = self._request("GET", path, None, self.timeout)
        if out.get("state") not in STATES:
            raise HostApiError(f"host {self.address}: unknown space state {out.get('state')!r}")
        return out


__all__ = ["STATES", "HostApiServer", "HostClient", "HostService"]
