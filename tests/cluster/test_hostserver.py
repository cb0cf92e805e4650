"""The host API's listener under abuse (durable_spaces/cluster/hostserver.py): the cluster's
own callers served while 100 hostile connections are open, and each bound proved by the
connection it cuts (caps per address and per identity, the handshake's, the headers' and
the body's deadlines). Each test waits for the cut itself (the server closing the
socket), with a socket timeout far above the bound as the only limit."""

from __future__ import annotations

import select
import socket
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tls_lab import served

from durable_spaces.campaigns.cluster.lab import wait_for
from durable_spaces.cluster.hostapi import HostClient
from durable_spaces.cluster.hostroutes import make_app
from durable_spaces.cluster.hostserver import Limits, Listener
from durable_spaces.cluster.pki import identity
from durable_spaces.cluster.tls import Trust

HOSTILE = Path(__file__).with_name("hostile.py")
H1 = identity("host", "h1").dns
#: Far above every bound a test sets: reached only when the bound does not hold.
NEVER = 30.0


class _Answers:
    """A host that answers at once: the listener is what is measured."""

    host_id = "h1"

    def __init__(self) -> None:
        self.placed = 0

    async def status(self, space: str, generation: int) -> dict[str, Any]:
        return {"state": "up", "boot": "b1"}

    async def place(self, space: str, generation: int) -> dict[str, Any]:
        self.placed += 1
        return {"address": "x", "generation": generation}

    async def rotate(self, space: str, generation: int, lease: int) -> dict[str, Any]:
        return {"rotated": False}


def _where(ln: Listener) -> tuple[str, int]:
    return ln.endpoint


def _address(ln: Listener) -> str:
    return f"{ln.endpoint[0]}:{ln.endpoint[1]}"


def _tcp(ln: Listener, source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection(_where(ln), timeout=NEVER, source_address=(source, 0))
    return s


def _member(ln: Listener, trust: Trust, source: str = "127.0.0.1") -> ssl.SSLSocket:
    """A connection whose TLS handshake is done, as ``trust``'s identity."""
    return trust.client_context().wrap_socket(_tcp(ln, source), server_hostname=H1)


def _cut(s: socket.socket) -> bool:
    """Waits until the server closes ``s`` (True), or ``NEVER`` passes (False)."""
    try:
        while s.recv(4096):
            pass
    except TimeoutError:
        return False
    except (OSError, ssl.SSLError):
        pass  # reset, or closed without a TLS goodbye: cut all the same
    return True


def _line(p: subprocess.Popen[str], timeout: float) -> str:
    """The process's next line of output, or '' when none came within ``timeout``."""
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline() if ready else ""


def _served(ln: Listener, trust: Trust, timeout: float = 10.0) -> bool:
    c = HostClient(_address(ln), "h1", trust, timeout=timeout)
    try:
        return c.status("sp", 1)["state"] == "up"
    finally:
        c.close()


def test_the_clusters_callers_are_served_while_100_hostile_connections_are_open(
    certs: Any, tmp_path: Path
) -> None:
    member = certs.enrol("coordinator", "evil")  # a cluster member gone bad
    (member / "crl.pem").write_text(certs.store.tls_crl())
    caller = certs.trust("coordinator", "c1")
    sources = ",".join(f"127.0.0.{i}" for i in range(2, 12))
    with served(make_app(_Answers()), certs.trust("host", "h1")) as ln:
        argv = [sys.executable, str(HOSTILE), _address(ln), "--sources", sources]
        argv += ["--kinds", "silent:40,hello:30,header:15,body:15,garbage:20"]
        argv += ["--member-tls", str(member)]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        try:
            assert _line(p, NEVER) == "ready\n", "the hostile clients never all connected"
            wait_for("100 hostile connections held", lambda: ln.total >= 100, NEVER)
            held, took = [], []
            for _ in range(40):  # each call a new connection: its handshake is measured too
                held.append(ln.total)
                t = time.monotonic()
                assert _served(ln, caller)
                took.append(time.monotonic() - t)
        finally:
            p.terminate()
            p.wait(NEVER)
        print(
            f"40/40 served, p50 {statistics.median(took) * 1000:.0f} ms, max"
            f" {max(took) * 1000:.0f} ms, while the server held {min(held)}..{max(held)}"
            f" connections; cut so far: {dict(ln.cuts)}"
        )


def test_connections_from_one_address_are_capped_before_their_handshake(certs: Any) -> None:
    limits = Limits(per_address=4, handshake_timeout=NEVER * 2)
    with served(make_app(_Answers()), certs.trust("host", "h1"), limits) as ln:
        held = [_tcp(ln, "127.0.0.3") for _ in range(4)]
        wait_for("four held", lambda: ln.per_address.get("127.0.0.3") == 4)
        fifth = _tcp(ln, "127.0.0.3")
        assert _cut(fifth)  # closed at accept, before any handshake
        assert ln.cuts["address_cap"] == 1
        assert _served(ln, certs.trust("coordinator", "c1"))  # another address is served
        held.pop().close()  # one given back: the address may open one again
        wait_for("three held", lambda: ln.per_address.get("127.0.0.3") == 3)
        held.append(_tcp(ln, "127.0.0.3"))
        wait_for("four held again", lambda: ln.per_address.get("127.0.0.3") == 4)
        for s in [*held, fifth]:
            s.close()


def test_connections_of_one_identity_are_capped(certs: Any) -> None:
    limits = Limits(per_identity=3, header_timeout=NEVER * 2)
    greedy = certs.trust("coordinator", "greedy")
    with served(make_app(_Answers()), certs.trust("host", "h1"), limits) as ln:
        held = [_member(ln, greedy) for _ in range(3)]
        who = identity("coordinator", "greedy")
        wait_for("three of it", lambda: ln.per_identity.get(who) == 3)
        fourth = _member(ln, greedy)
        assert _cut(fourth)
        assert ln.cuts["identity_cap"] == 1
        assert _served(ln, certs.trust("coordinator", "c1"))  # another identity is served
        for s in [*held, fourth]:
            s.close()


def test_a_role_it_does_not_serve_is_cut_after_its_handshake(certs: Any) -> None:
    """The role read from a verified certificate (a host's own is refused earlier still,
    by its purpose): a listener for workers only cuts a coordinator."""
    service = _Answers()
    with served(make_app(service), certs.trust("host", "h1"), roles=("worker",)) as ln:
        s = _member(ln, certs.trust("coordinator", "c1"))
        s.sendall(b"POST /v1/hosts/h1/place HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
        assert _cut(s)
        s.close()
        assert ln.cuts["role"] == 1 and service.placed == 0
        assert _served(ln, certs.trust("worker", "w1"))


def test_a_connection_that_never_starts_its_handshake_is_cut(certs: Any) -> None:
    limits = Limits(handshake_timeout=0.5)
    with served(make_app(_Answers()), certs.trust("host", "h1"), limits) as ln:
        with _tcp(ln) as s:
            assert _cut(s)  # asyncio's own bound would be 60 s, past NEVER
        wait_for("the cut counted", lambda: ln.cuts["handshake"] == 1)
        assert ln.total == 0


def test_a_member_trickling_its_headers_is_cut(certs: Any) -> None:
    limits = Limits(header_timeout=1.0)
    with served(make_app(_Answers()), certs.trust("host", "h1"), limits) as ln:
        s = _member(ln, certs.trust("coordinator", "c1"))
        s.settimeout(0.1)
        start = time.monotonic()
        head = b"GET /v1/hosts/h1/spaces/sp?generation=1 HTTP/1.1\r\nX-Slow: " + b"a" * 1000
        for i in range(len(head)):  # a byte each tenth of a second: no read ever idles long
            try:
                s.sendall(head[i : i + 1])
                if s.recv(1) == b"":
                    break
            except TimeoutError:
                continue
            except (OSError, ssl.SSLError):
                break
            assert time.monotonic() - start < NEVER, "the trickle was never cut"
        s.close()
        assert ln.cuts["header"] == 1


def test_a_member_holding_back_its_body_is_cut_and_nothing_is_done(certs: Any) -> None:
    limits = Limits(body_timeout=0.5)
    service = _Answers()
    with served(make_app(service), certs.trust("host", "h1"), limits) as ln:
        s = _member(ln, certs.trust("coordinator", "c1"))
        s.sendall(b"POST /v1/hosts/h1/place HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        s.sendall(b'{"space": "sp", ')  # and no more
        assert _cut(s)
        s.close()
        assert ln.cuts["body"] == 1 and service.placed == 0


def test_the_tls_handshake_comes_before_any_http(certs: Any) -> None:
    """The old API's attack, a body promised in plain HTTP, never reaches HTTP at all."""
    service = _Answers()
    with served(make_app(service), certs.trust("host", "h1")) as ln:
        with _tcp(ln) as s:
            s.sendall(b"POST /v1/hosts/h1/place HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            assert _cut(s)
        wait_for("the failed handshake counted", lambda: ln.cuts["handshake"] == 1)
        assert service.placed == 0 and ln.state.total_requests == 0


@pytest.mark.parametrize("keep_alive", [True, False])
def test_a_caller_is_served_again_on_its_connection_or_a_new_one(
    certs: Any, keep_alive: bool
) -> None:
    trust = certs.trust("coordinator", "c1")
    with served(make_app(_Answers()), certs.trust("host", "h1")) as ln:
        c = HostClient(_address(ln), "h1", trust)
        for _ in range(3):
            assert c.status("sp", 1)["state"] == "up"
            if not keep_alive:
                c.close()
                c = HostClient(_address(ln), "h1", trust)
        c.close()
        # counted by the server's thread just after it sent the answer the client read
        wait_for("three requests counted", lambda: ln.state.total_requests == 3)
