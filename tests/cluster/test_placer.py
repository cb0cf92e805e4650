"""An answer is trusted only from the host that owns the Space, and no answer deletes
anything by itself (durable_spaces/cluster/placer.py): the impostor of a restarting host,
with a plain HTTP server, a certificate of its own or another host's, gets nothing done,
and the Space and its files are there when the real host is back. Real host agent (local
backend), real store, real TLS."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tls_lab import answers, running_agent, served

from durable_spaces.campaigns.cluster.lab import wait_for
from durable_spaces.cluster import pki
from durable_spaces.cluster.address import LocalAddress, parse_address
from durable_spaces.cluster.hostroutes import make_app
from durable_spaces.cluster.placer import Placer
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.cluster.tls import TlsDir, Trust
from durable_spaces.errors import SpaceUnavailableError

#: The lost-host bound: longer than any test here, so only an answer could unplace (and a
#: placer keeps asking a silent host that long: the tests ask from a thread).
NEVER_LOST = 3600.0


class _SaysUnknown:
    host_id = "h1"

    def __init__(self) -> None:
        self.asked = 0

    async def status(self, space: str, generation: int) -> dict[str, Any]:
        self.asked += 1
        return {"state": "unknown", "boot": None}

    async def place(self, space: str, generation: int) -> dict[str, Any]:
        raise AssertionError("nobody places on an impostor")

    async def rotate(self, space: str, generation: int, lease: int) -> dict[str, Any]:
        raise AssertionError("nobody rotates on an impostor")


@contextmanager
def _plain_http_impostor(address: str) -> Iterator[list[str]]:
    """The impostor the placer once believed: plain HTTP on the port, ``unknown`` to
    everything; lists the connections it was given."""
    heard: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def handle(self) -> None:
            heard.append("connection")
            super().handle()

        def _unknown(self) -> None:
            data = json.dumps({"state": "unknown", "boot": None}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _unknown

        def log_message(self, format: str, *args: Any) -> None:
            return

    host, _, port = address.rpartition(":")
    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield heard
    finally:
        server.shutdown()
        server.server_close()


def _heard(impostor: Any) -> int:
    """How many times the impostor was dialled (a TLS one: handshakes it lost)."""
    return len(impostor) if isinstance(impostor, list) else int(impostor.cuts["handshake"])


def _foreign_h1(root: Path) -> Trust:
    """A certificate naming host h1, from a CA of the impostor's own."""
    ca = pki.make_ca()
    key = pki.new_key()
    d = TlsDir(root / "foreign-h1")
    d.write_ca(ca.cert)
    d.write_identity(key, pki.issue(ca, key.public_key(), pki.identity("host", "h1")))
    t = Trust(d.path)
    t.set_crl(pki.crl_pem(pki.make_crl(ca, [], 1)))
    return t


@pytest.mark.parametrize("impostor", ["plain http", "its own CA", "host h2's certificate"])
def test_an_impostor_on_a_restarting_hosts_port_deletes_nothing(
    pg_url: str, tmp_path: Path, certs: Any, impostor: str
) -> None:
    s: ClusterStore = certs.store
    placer = Placer(s, certs.trust("coordinator", "c1"), lost_host_secs=NEVER_LOST)
    h1_tls = certs.enrol("host", "h1")
    s.create_space("sp1")
    with running_agent(pg_url, tmp_path / "h1", h1_tls) as agent:
        address = agent.address
        wait_for("h1's API", lambda: answers(certs.client("h1", address)))
        placed = placer.ensure("sp1")
        assert (placed.host_id, placed.generation) == ("h1", 1)
        addr = parse_address(placed.address or "")
        assert isinstance(addr, LocalAddress)
        work = Path(addr.state_dir) / addr.name
        (work / "work.txt").write_text("the agent's work")
    # h1 is restarting; a coordinator wants the Space; something else answers on the port
    got: list[Any] = []
    asking = threading.Thread(target=lambda: got.append(_ensured(placer, "sp1")), daemon=True)
    if impostor == "plain http":
        impersonation: Any = _plain_http_impostor(address)
    elif impostor == "its own CA":
        impersonation = served(make_app(_SaysUnknown()), _foreign_h1(tmp_path), address=address)
    else:
        h2 = certs.trust("host", "h2")
        impersonation = served(make_app(_SaysUnknown()), h2, address=address)
    with impersonation as heard:
        asking.start()
        wait_for("the placer to dial the impostor a few times", lambda: _heard(heard) >= 3)
        sp = s.space("sp1")
        assert (sp.state, sp.generation, sp.host_id) == ("ready", 1, "h1")
        assert not s.events("space_unplaced") and not got  # nothing believed, still asking
    # the real h1 is back, on its state dir and its certificate: nothing was lost
    with running_agent(pg_url, tmp_path / "h1", h1_tls, address=address):
        asking.join(120)
        assert got and (got[0].host_id, got[0].generation) == ("h1", 1), got
        assert (work / "work.txt").read_text() == "the agent's work"
        assert not s.events("space_unplaced")
    placer.close()


def _ensured(placer: Placer, name: str) -> Any:
    try:
        return placer.ensure(name)
    except Exception as e:  # shown by the assertion that reads it
        return e


def test_the_owners_own_unknown_unplaces_nothing(certs: Any) -> None:
    """Even h1 itself, rightly authenticated, answering ``unknown``: the placer waits; only
    h1's report to the store (or its heartbeat lapsing) moves the Space."""
    s: ClusterStore = certs.store
    placer = Placer(s, certs.trust("coordinator", "c1"), lost_host_secs=NEVER_LOST)
    service = _SaysUnknown()
    with served(make_app(service), certs.trust("host", "h1")) as ln:
        s.register_host("h1", f"{ln.endpoint[0]}:{ln.endpoint[1]}", "local")
        s.create_space("sp1")
        s.place_space("sp1", 1, "h1", "local:///x?name=dsc-sp1-1&instance=i1", "t")
        with pytest.raises(SpaceUnavailableError, match="does not provide generation 1 now"):
            placer.ensure("sp1")
        assert service.asked >= 1
        sp = s.space("sp1")
        assert (sp.state, sp.generation) == ("ready", 1)
        s.space_lost("sp1", 1, "its own report", host="h1")  # the host's word: that moves it
        assert s.space("sp1").generation == 2
    placer.close()
