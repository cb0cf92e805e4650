"""The host agent's HTTP API, and its client: how coordinators and drivers ask a host about
the Spaces it provides (the reference's HostSpacesService, in JSON over mutual TLS).

Three requests, all safe to repeat and all checked against the store by the host. The
target host is in every path, and a host refuses a request for another (421): whoever
holds a request meant for h1 cannot have h2 act on it.

- ``POST /v1/hosts/<host>/place {"space", "generation"}``: provide that generation of a
  durable Space (create the sandbox, record the placement in the store). Answers the
  address; the Space's token goes from the host to the store directly, never through the
  caller. A generation that is not waiting for placement is refused (409): nobody can make
  a host take a Space the store did not put up for placement.
- ``POST /v1/hosts/<host>/rotate {"space", "generation", "lease"}``: give the Space's
  daemon a new access token for lease token ``lease``, the Space's current one (the old
  token is refused from then on), and record it in the store for that lease's holder only;
  a daemon floor above the epoch the store issued with that lease is taken back to it. A
  lease that is not the current one is refused (409).
- ``GET /v1/hosts/<host>/spaces/<name>?generation=N``: ``up`` (with the daemon's boot
  identity, which changes with every start), ``down`` (the sandbox exists, its daemon does
  not answer), ``gone`` (the sandbox was removed: the host has reported it to the store)
  or ``unknown`` (this host does not provide that generation now). Read-only but for the
  report of a gone sandbox, which the host makes itself.

The routes are ``hostroutes.py``'s (a host's own, apart from this client: the processes
that only ask never import the server's libraries). Who may ask is settled before any of
this is read (``hostserver.py``: the peer's certificate, its role, the bounds on
connections, headers and bodies); the client checks that the server is the host it meant
(``HostClient``: the certificate must name it). Errors are JSON ``{"error": ...}``, one
line, with 400 (a malformed body or number), 404 (no such Space or resource), 409
(conflict), 413 (a body over 64 KiB), 421 (a request for another host), 503 (anything
else: try again).
"""

from __future__ import annotations

import socket
import ssl
import sys
import threading
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from durable_spaces.cluster import pki
from durable_spaces.cluster.address import check_endpoint
from durable_spaces.cluster.records import check_name
from durable_spaces.cluster.tls import Trust
from durable_spaces.errors import (
    ClusterConflictError,
    ConfigError,
    HostApiError,
    HostAuthError,
    UnknownRecordError,
)
from durable_spaces.host.bounded import parse_json


def _import_httpx() -> Any:
    """httpx without its command-line client: ``httpx/__init__.py`` imports ``httpx._main``
    (click, rich, pygments) and falls back when that import fails. Every driver imports
    this module at its start, and that client was most of its import's cost; a ``None``
    in ``sys.modules`` makes the import fail for the moment of httpx's own import only."""
    if "httpx" in sys.modules or "httpx._main" in sys.modules:
        import httpx
    else:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]
        try:
            import httpx
        finally:
            if sys.modules.get("httpx._main", 0) is None:
                del sys.modules["httpx._main"]
    return httpx


if TYPE_CHECKING:
    import httpx
else:
    httpx = _import_httpx()

STATES = ("up", "down", "gone", "unknown")
MAX_BODY = 64 * 1024
#: A client drops an idle connection before the server would (``hostserver.Limits``'s
#: keep-alive), so it never sends a request down a connection being closed.
CLIENT_KEEPALIVE_SECS = 2.0


def _tls_refusal(e: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a transport error, if it is one: the peer is not who it must be."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ssl.SSLError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


class HostClient:
    """Asks host ``host_id`` (at ``address``, ``ip:port``) about its Spaces, as the
    identity in ``trust``; an answer is taken only from a peer whose certificate names
    ``host_id``, whatever is listening at the address. Blocking; thread-safe."""

    def __init__(self, address: str, host_id: str, trust: Trust, *, timeout: float = 2.0) -> None:
        check_endpoint("host address", address)
        self.address = address
        self.host = pki.identity("host", host_id)
        self.timeout = timeout
        self.version = trust.version
        self._http = httpx.Client(
            base_url=f"https://{address}",
            timeout=timeout,
            trust_env=False,  # no proxy from the environment between the cluster's parts
            follow_redirects=False,
            transport=httpx.HTTPTransport(
                verify=trust.client_context(),
                limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_SECS),
                # a request's small writes go out at once (Nagle would hold them for an ACK)
                socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            ),
        )

    def __repr__(self) -> str:
        return f"HostClient({self.host.id!r}, {self.address!r})"

    def close(self) -> None:
        self._http.close()

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float
    ) -> dict[str, Any]:
        who = f"host {self.host.id} at {self.address}"
        try:
            with self._http.stream(
                method,
                f"/v1/hosts/{self.host.id}{path}",
                json=body,
                timeout=timeout,
                # the name the certificate must carry, whatever address is dialled
                extensions={"sni_hostname": self.host.dns},
            ) as r:
                data = bytearray()
                for chunk in r.iter_bytes():
                    data += chunk
                    if len(data) > MAX_BODY:  # an answer is small; more is not read
                        raise HostApiError(f"{who} answered more than {MAX_BODY} bytes")
            out = parse_json(bytes(data), where=f"{who}'s answer")
        except httpx.TransportError as e:
            refusal = _tls_refusal(e)
            if refusal is not None:
                raise HostAuthError(f"{who} is not trusted: {refusal}") from None
            raise HostApiError(f"{who} did not answer: {type(e).__name__}: {e}") from None
        except ValueError as e:
            raise HostApiError(f"{who} answered something other than JSON: {e}") from None
        if not isinstance(out, dict):
            raise HostApiError(f"{who} answered something other than an object")
        if r.status_code == HTTPStatus.OK:
            return out
        why = str(out.get("error", r.reason_phrase))
        if r.status_code == HTTPStatus.CONFLICT:
            raise ClusterConflictError(f"{who}: {why}")
        if r.status_code in (HTTPStatus.BAD_REQUEST, HTTPStatus.REQUEST_ENTITY_TOO_LARGE):
            raise ConfigError(f"{who}: {why}")
        if r.status_code == HTTPStatus.NOT_FOUND:
            raise UnknownRecordError(f"{who}: {why}")
        if r.status_code == HTTPStatus.MISDIRECTED_REQUEST:
            raise HostAuthError(f"{who}: {why}")
        raise HostApiError(f"{who} answered {r.status_code}: {why}")

    def place(self, space: str, generation: int, *, timeout: float = 120.0) -> dict[str, Any]:
        """Have the host provide ``generation`` of ``space``; its answer (``address``)."""
        body = {"space": check_name("space", space), "generation": generation}
        return self._request("POST", "/place", body, timeout)

    def rotate(self, space: str, generation: int, lease: int) -> dict[str, Any]:
        """Have the host give the Space's daemon a new token for lease ``lease``."""
        body = {"space": check_name("space", space), "generation": generation, "lease": lease}
        return self._request("POST", "/rotate", body, 120.0)

    def status(self, space: str, generation: int) -> dict[str, Any]:
        """``{"state": up|down|gone|unknown, "boot": ...}`` for that generation."""
        path = f"/spaces/{quote(check_name('space', space), safe='')}?generation={generation}"
        out = self._request("GET", path, None, self.timeout)
        if out.get("state") not in STATES:
            raise HostApiError(f"host {self.host.id}: unknown space state {out.get('state')!r}")
        return out


class HostClients:
    """One ``HostClient`` per host identity and address, made again when ``trust``'s
    version changes (a revocation list or a rotated certificate). Never one client for two
    hosts: a connection proved to be h1 must not carry a request meant for h3."""

    def __init__(self, trust: Trust, *, timeout: float = 2.0) -> None:
        self.trust = trust
        self.timeout = timeout
        self._clients: dict[tuple[str, str], HostClient] = {}
        self._lock = threading.Lock()

    def get(self, host_id: str, address: str) -> HostClient:
        with self._lock:
            key = (host_id, address)
            c = self._clients.get(key)
            if c is not None and c.version != self.trust.version:
                c.close()
                c = None
            if c is None:
                c = HostClient(address, host_id, self.trust, timeout=self.timeout)
                self._clients[key] = c
            return c

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()


__all__ = ["MAX_BODY", "STATES", "HostClient", "HostClients"]
