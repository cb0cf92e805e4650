"""The host API's listener: mutual TLS first, then HTTP, within bounds no peer can talk
its way around. The TLS is OpenSSL's through asyncio, the HTTP uvicorn's ``H11Protocol``,
the application ``hostroutes.py``'s.

Why not uvicorn's own server: it hands every accepted socket to a TLS handshake bounded
only by asyncio's default (60 s), has no cap per peer, and bounds neither a request's
headers nor its body in time (its keep-alive timeout counts only the silence between
requests). So the accept loop is ours, over asyncio's public ``sock_accept`` and
``connect_accepted_socket`` (which runs the handshake), and uvicorn's protocol gets each
connection once its peer is known:

1. at accept: at most ``per_address`` connections from one address and ``total`` in all,
   counted from accept to close; more are closed at once, before a handshake costs
   anything;
2. the handshake (the peer's certificate against the cluster CA and its revocation list,
   ``tls.Trust``) must end within ``handshake_timeout``; nothing of HTTP is read before;
3. then the peer's name: a role in ``roles`` (a host serves coordinators and workers, never
   another host) and at most ``per_identity`` connections of one identity;
4. a request's headers must arrive within ``header_timeout`` of the connection's start
   (after a response: of the ``keep_alive`` silence allowed between requests), its body
   within ``body_timeout`` of its headers; else the connection is cut.

Each way a connection ends early is counted in ``cuts`` (by reason), which is what the
tests wait for. ``revoke()`` cuts the connections of certificates the newest revocation
list names. ``close()`` stops accepting, lets requests in flight finish for ``grace``
seconds, then cuts what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from durable_spaces.cluster import pki
from durable_spaces.cluster.address import check_endpoint
from durable_spaces.cluster.tls import Trust, peer_identity, peer_serial

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Limits:
    """The listener's bounds (module doc); the defaults are the host agent's."""

    handshake_timeout: float = 5.0
    header_timeout: float = 5.0
    body_timeout: float = 10.0
    keep_alive: float = 5.0
    per_address: int = 64
    per_identity: int = 64
    total: int = 512
    grace: float = 5.0


class _Connection(H11Protocol):
    """One accepted connection: counted from accept, uvicorn's HTTP once its peer passed."""

    def __init__(self, listener: Listener, address: str) -> None:
        super().__init__(listener.config, listener.state, {})
        self.listener = listener
        self.address = address
        self.peer: pki.Identity | None = None
        self.serial: int | None = None
        self.refused = False
        self.released = False
        self.timer: asyncio.TimerHandle | None = None
        self.app = self._bounded  # uvicorn runs self.app for each request

    # -- the peer ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        ln = self.listener
        cert = transport.get_extra_info("peercert")
        who = peer_identity(cert)
        why = None
        if who is None or who.role not in ln.roles:
            why = "role"
        elif ln.per_identity[who] >= ln.limits.per_identity:
            why = "identity_cap"
        if why is not None:
            self.refused = True
            ln.cuts[why] += 1
            transport.abort()
            return
        assert who is not None
        self.peer, self.serial = who, peer_serial(cert)
        ln.per_identity[who] += 1
        self.app_state["peer"] = who  # each request's scope["state"]
        super().connection_made(transport)
        ln.live.add(self)
        self._arm(ln.limits.header_timeout, "header")

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.listener.release(self)
        if not self.refused:
            super().connection_lost(exc)

    # -- time bounds ---------------------------------------------------------------------

    def _arm(self, secs: float, why: str) -> None:
        self._disarm()
        self.timer = self.loop.call_later(secs, self.cut, why)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def cut(self, why: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.listener.cuts[why] += 1
            self.transport.abort()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():  # the next request's headers: after the silence
            self._arm(self.timeout_keep_alive + self.listener.limits.header_timeout, "header")

    async def _bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, with the headers' timer off and the body's on until it is whole."""
        self._disarm()
        deadline = self.loop.time() + self.listener.limits.body_timeout
        whole = False

        async def bounded_receive() -> Message:
            nonlocal whole
            if whole:
                return await receive()
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - self.loop.time()))
            except TimeoutError:
                self.cut("body")
                return {"type": "http.disconnect"}
            whole = msg.get("type") != "http.request" or not msg.get("more_body", False)
            return msg

        await self.listener.app(scope, bounded_receive, send)


class Listener:
    """Serves ``app`` on ``address`` (``ip:port``) to peers ``trust`` accepts whose role
    is in ``roles`` (module doc). ``start()`` and ``close()`` on the loop that serves."""

    def __init__(
        self,
        address: str,
        app: App,
        trust: Trust,
        *,
        roles: Collection[str] = pki.CLIENT_ROLES,
        limits: Limits | None = None,
    ) -> None:
        self.endpoint = check_endpoint("host address", address)
        self.app = app
        self.trust = trust
        self.roles = frozenset(roles)
        self.limits = limits or Limits()
        self.config = uvicorn.Config(
            app,
            lifespan="off",
            proxy_headers=False,  # the peer is who its certificate says, not a header
            server_header=False,
            date_header=False,
            access_log=False,
            log_config=None,
            http="h11",
            ws="none",
            timeout_keep_alive=int(self.limits.keep_alive),
        )
        self.config.load()
        self.state = ServerState()
        self.cuts: Counter[str] = Counter()
        self.per_address: Counter[str] = Counter()
        self.per_identity: Counter[pki.Identity] = Counter()
        self.total = 0
        self.live: set[_Connection] = set()
        self._handshakes: set[asyncio.Task[None]] = set()
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"Listener({self.endpoint[0]}:{self.endpoint[1]}, {self.trust.identity})"

    async def start(self) -> None:
        sock = socket.create_server(self.endpoint, backlog=1024)
        sock.setblocking(False)
        self._sock = sock
        self._accepting = asyncio.get_running_loop().create_task(self._accept(sock))

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except OSError as e:  # out of descriptors: the ones held end by their timeouts
                self.cuts["accept_error"] += 1
                log.warning("accept failed: %s", e)
                await asyncio.sleep(0.05)
                continue
            # An answer's TLS records go out at once: asyncio leaves Nagle on for an
            # accepted socket it is handed, and each answer then waited ~40 ms for an ACK.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            address = str(peer[0])
            if self.total >= self.limits.total or (
                self.per_address[address] >= self.limits.per_address
            ):
                self.cuts["address_cap"] += 1
                conn.close()
                continue
            self.total += 1
            self.per_address[address] += 1
            task = loop.create_task(self._handshake(conn, address))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, address: str) -> None:
        c = _Connection(self, address)
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: c,
                conn,
                ssl=self.trust.server_context(),
                ssl_handshake_timeout=self.limits.handshake_timeout,
            )
        except Exception as e:  # no certificate, a bad one, too slow, or gone: no HTTP
            self.cuts["handshake"] += 1
            log.debug("handshake from %s failed: %s: %s", address, type(e).__name__, e)
            conn.close()
            self.release(c)

    def release(self, c: _Connection) -> None:
        """What ``c`` counted, given back once (its handshake failed, or it closed)."""
        if c.released:
            return
        c.released = True
        self.total -= 1
        self.per_address[c.address] -= 1
        if self.per_address[c.address] <= 0:
            del self.per_address[c.address]
        if c.peer is not None:
            self.per_identity[c.peer] -= 1
            if self.per_identity[c.peer] <= 0:
                del self.per_identity[c.peer]
        self.live.discard(c)

    def revoke(self) -> int:
        """Cut the connections of certificates ``trust``'s revocation list names."""
        cut = [c for c in self.live if self.trust.revoked(c.serial)]
        for c in cut:
            c.cut("revoked")
        return len(cut)

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(BaseException):
                await self._accepting
        if self._sock is not None:
            self._sock.close()
        for t in list(self._handshakes):
            t.cancel()
        for c in list(self.live):
            c.shutdown()  # uvicorn's: closes when idle, after the response otherwise
        if self.state.tasks:
            await asyncio.wait(list(self.state.tasks), timeout=self.limits.grace)
        for c in list(self.live):
            c.cut("closed")


__all__ = ["Limits", "Listener"]
