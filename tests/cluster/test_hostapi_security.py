"""Who may speak to a host, and whom a coordinator believes (durable_spaces/cluster/hostapi.py,
tls.py, pki.py): names checked both ways, a request bound to its host, expired and revoked
certificates refused, a rotated one taken without a restart, malformed numbers answered
400 in one line. Real certificates of a test CA, a real host agent, real TLS."""

from __future__ import annotations

import datetime as dt
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tls_lab import answers, running_agent, served

from durable_spaces.campaigns.cluster.lab import wait_for
from durable_spaces.cluster import enrol, pki
from durable_spaces.cluster.host import HostAgent
from durable_spaces.cluster.hostapi import HostClient
from durable_spaces.cluster.hostroutes import make_app
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.cluster.tls import TlsDir, Trust
from durable_spaces.errors import HostApiError, HostAuthError, TlsError


@pytest.fixture
def agent(pg_url: str, tmp_path: Path, certs: Any) -> Iterator[HostAgent]:
    with running_agent(pg_url, tmp_path / "h1", certs.enrol("host", "h1")) as a:
        wait_for("the agent's API", lambda: answers(certs.client("h1", a.address)))
        yield a


class _Unknown:
    """A host that provides nothing (as an impostor would say)."""

    def __init__(self, host_id: str = "h1") -> None:
        self.host_id = host_id
        self.asked = 0

    async def status(self, space: str, generation: int) -> dict[str, Any]:
        self.asked += 1
        return {"state": "unknown", "boot": None}

    async def place(self, space: str, generation: int) -> dict[str, Any]:
        self.asked += 1
        return {"address": "x", "generation": generation}

    async def rotate(self, space: str, generation: int, lease: int) -> dict[str, Any]:
        self.asked += 1
        return {"rotated": True}


def _address(ln: Any) -> str:
    return f"{ln.endpoint[0]}:{ln.endpoint[1]}"


def _peer_serial(address: str, trust: Trust, name: str) -> int:
    """The serial of the certificate the server at ``address`` presents as ``name``."""
    host, _, port = address.rpartition(":")
    with (
        socket.create_connection((host, int(port)), timeout=30) as raw,
        trust.client_context().wrap_socket(raw, server_hostname=name) as s,
    ):
        der = s.getpeercert(binary_form=True)
    assert der is not None
    return int(pki.load_cert("peer", ssl.DER_cert_to_PEM_cert(der)).serial_number)


def _pem(cert: Any) -> str:
    return pki.cert_pem(cert).decode()


def _place_raw(address: str, ctx: ssl.SSLContext) -> None:
    """A placement asked of h1 by a client of ``ctx``'s making: it must fail in TLS."""
    client = httpx.Client(base_url=f"https://{address}", verify=ctx, trust_env=False)
    with pytest.raises(httpx.TransportError):
        client.post(
            "/v1/hosts/h1/place",
            json={"space": "sp1", "generation": 1},
            extensions={"sni_hostname": pki.identity("host", "h1").dns},
        )


# -- a host serves only the cluster's coordinators and workers ------------------------------


def test_coordinators_and_workers_are_served_and_nobody_else(agent: HostAgent, certs: Any) -> None:
    s: ClusterStore = certs.store
    s.create_space("sp1")
    assert certs.client("h1", agent.address, "c1").status("sp1", 1)["state"] == "unknown"
    worker = HostClient(agent.address, "h1", certs.trust("worker", "w1"))
    assert worker.status("sp1", 1)["state"] == "unknown"
    another_host = HostClient(agent.address, "h1", certs.trust("host", "h2"))
    with pytest.raises(HostApiError):
        another_host.place("sp1", 1)
    # no certificate at all: the CA is known, nothing is presented
    _place_raw(agent.address, ssl.create_default_context(cadata=_pem(certs.ca.cert)))
    # the server counts a cut handshake after the client has seen it refused: wait for it
    deadline = time.monotonic() + 300.0  # a hang, not a pace
    while agent.api is not None and agent.api.cuts["handshake"] < 2:
        assert time.monotonic() < deadline, agent.api.cuts
        time.sleep(0.01)
    assert agent.api is not None and agent.api.cuts["handshake"] >= 2  # EKU, no certificate
    assert s.space("sp1").state == "unplaced"  # neither placed anything


def test_a_certificate_of_another_ca_is_refused(
    agent: HostAgent, certs: Any, tmp_path: Path
) -> None:
    """A coordinator's name, rightly formed, signed by a CA that is not the cluster's."""
    s: ClusterStore = certs.store
    s.create_space("sp1")
    other = pki.make_ca()
    key = pki.new_key()
    cert = pki.issue(other, key.public_key(), pki.identity("coordinator", "c1"))
    ctx = ssl.create_default_context(cadata=_pem(certs.ca.cert))
    own = tmp_path / "own.pem"
    own.write_bytes(pki.key_pem(key) + pki.cert_pem(cert))
    ctx.load_cert_chain(own)
    _place_raw(agent.address, ctx)
    assert s.space("sp1").state == "unplaced"
    with pytest.raises(TlsError, match="not issued by the CA"):  # nor can it be installed
        d = TlsDir(tmp_path / "tls")
        d.write_ca(certs.ca.cert)
        d.write_identity(key, cert)
        Trust(d.path)


# -- a coordinator believes only the host it meant ------------------------------------------


def test_a_coordinator_takes_answers_only_from_the_host_it_means(certs: Any) -> None:
    caller = certs.trust("coordinator", "c1")
    with served(make_app(_Unknown("h2")), certs.trust("host", "h2")) as ln:
        with pytest.raises(HostAuthError, match=r"not valid for 'h1\.host"):
            HostClient(_address(ln), "h1", caller).status("sp1", 1)  # h2 is not h1
        assert HostClient(_address(ln), "h2", caller).status("sp1", 1)["state"] == "unknown"
    # a coordinator's certificate cannot serve (its purpose is the client's)
    as_server = certs.trust("coordinator", "h1")
    with (
        served(make_app(_Unknown()), as_server) as ln,
        pytest.raises(HostAuthError, match=r"purpose|verify failed"),
    ):
        HostClient(_address(ln), "h1", caller).status("sp1", 1)
    # a certificate naming h1 that the cluster's CA did not sign
    stranger = pki.make_ca()
    key = pki.new_key()
    d = TlsDir(certs.root / "stranger")
    d.write_ca(stranger.cert)
    d.write_identity(key, pki.issue(stranger, key.public_key(), pki.identity("host", "h1")))
    fake = Trust(d.path)
    fake.set_crl(pki.crl_pem(pki.make_crl(stranger, [], 1)))
    service = _Unknown()
    with (
        served(make_app(service), fake) as ln,
        pytest.raises(HostAuthError, match="verify failed"),
    ):
        HostClient(_address(ln), "h1", caller).status("sp1", 1)
    assert service.asked == 0


def test_a_request_for_another_host_is_refused_where_it_lands(agent: HostAgent, certs: Any) -> None:
    """What h2 was asked cannot be made to happen on h1, by h2 or anyone holding it."""
    s: ClusterStore = certs.store
    s.create_space("sp1")
    client = certs.client("h1", agent.address)
    r = client._http.post(
        "/v1/hosts/h2/place",
        json={"space": "sp1", "generation": 1},
        extensions={"sni_hostname": client.host.dns},
    )
    assert r.status_code == 421 and "this is host h1" in r.json()["error"]
    assert s.space("sp1").state == "unplaced"
    with pytest.raises(HostAuthError):  # and a client of h2 never reaches h1 at all
        certs.client("h2", agent.address).place("sp1", 1)
    assert s.space("sp1").state == "unplaced"
    client.place("sp1", 1)  # the request for h1 itself
    assert s.space("sp1").host_id == "h1"


# -- expired, not yet valid, revoked, rotated -----------------------------------------------


@pytest.mark.parametrize("when", ["expired", "not yet valid"])
def test_a_certificate_out_of_its_dates_is_refused_both_ways(
    agent: HostAgent, certs: Any, when: str
) -> None:
    s: ClusterStore = certs.store
    s.create_space("sp1")
    now = dt.datetime.now(dt.UTC)
    start = now - dt.timedelta(days=3) if when == "expired" else now + dt.timedelta(days=3)
    stale = certs.trust("coordinator", "c9", days=1, not_before=start)
    with pytest.raises(HostApiError):
        HostClient(agent.address, "h1", stale).place("sp1", 1)
    assert s.space("sp1").state == "unplaced"
    caller = certs.trust("coordinator", "c1")
    stale_host = certs.trust("host", "h1", days=1, not_before=start)
    with (
        served(make_app(_Unknown()), stale_host) as ln,
        pytest.raises(HostAuthError, match=r"expired|not yet valid"),
    ):
        HostClient(_address(ln), "h1", caller).status("sp1", 1)


def test_a_revoked_coordinator_is_cut_off_and_others_are_not(agent: HostAgent, certs: Any) -> None:
    s: ClusterStore = certs.store
    s.create_space("sp1")
    bad = certs.trust("coordinator", "c1")
    good = certs.trust("coordinator", "c2")
    held = HostClient(agent.address, "h1", bad)
    assert held.status("sp1", 1)["state"] == "unknown"  # a kept-alive connection, open
    lines = enrol.revoke(s, certs.ca_dir, serials=[pki.serial_text(bad.serial)])
    assert lines == [f"revoked coordinator c1: certificate {pki.serial_text(bad.serial)}"
                     " (revocation list 2)"]  # fmt: skip
    wait_for("the host to read the new list", lambda: agent.trust.crl_number == 2)
    assert agent.api is not None
    wait_for("the open connection cut", lambda: agent.api is not None and agent.api.cuts["revoked"])
    with pytest.raises(HostApiError):
        held.place("sp1", 1)
    with pytest.raises(HostApiError):
        HostClient(agent.address, "h1", bad).place("sp1", 1)
    assert s.space("sp1").state == "unplaced"
    assert HostClient(agent.address, "h1", good).status("sp1", 1)["state"] == "unknown"


def test_a_revoked_host_is_not_believed(agent: HostAgent, certs: Any) -> None:
    s: ClusterStore = certs.store
    caller = certs.trust("coordinator", "c1")
    assert HostClient(agent.address, "h1", caller).status("sp1", 1)["state"] == "unknown"
    enrol.revoke(s, certs.ca_dir, who_id="h1", role="host")
    assert caller.refresh(s)  # a coordinator's next read of the list (Placer: every second)
    with pytest.raises(HostAuthError, match="revoked"):
        HostClient(agent.address, "h1", caller).status("sp1", 1)


def test_a_rolled_back_revocation_list_is_not_taken(certs: Any) -> None:
    s: ClusterStore = certs.store
    caller = certs.trust("coordinator", "c1")
    first = s.tls_crl()
    assert first is not None
    enrol.revoke(s, certs.ca_dir, who_id="h9", role="host") if False else None
    certs.enrol("host", "h2")
    enrol.revoke(s, certs.ca_dir, who_id="h2", role="host")
    assert caller.refresh(s) and caller.crl_number == 2
    assert not caller.set_crl(first)  # a database that hands out the older list
    assert caller.crl_number == 2
    forged = pki.make_crl(pki.make_ca(), [], 9)
    with pytest.raises(TlsError, match="not the cluster CA's"):
        caller.set_crl(pki.crl_pem(forged))


def test_a_rotated_host_certificate_is_taken_without_a_restart(
    agent: HostAgent, certs: Any
) -> None:
    caller = certs.trust("coordinator", "c1")
    name = pki.identity("host", "h1").dns
    old = _peer_serial(agent.address, caller, name)
    assert old == agent.trust.serial
    certs.enrol("host", "h1")  # into the same directory: a new key and certificate
    wait_for("the agent to present it", lambda: agent.trust.serial != old)
    new = _peer_serial(agent.address, caller, name)
    assert new == agent.trust.serial != old
    enrol.revoke(certs.store, certs.ca_dir, serials=[pki.serial_text(old)])  # the old one retired
    caller.refresh(certs.store)
    assert HostClient(agent.address, "h1", caller).status("sp1", 1)["state"] == "unknown"


# -- malformed input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/hosts/h1/place", b'{"space": "sp1", "generation": ' + b"7" * 5000 + b"}"),
        ("POST", "/v1/hosts/h1/place", b'{"space": "sp1", "generation": ' + b"7" * 4000 + b"}"),
        ("POST", "/v1/hosts/h1/place", b'{"space": "sp1", "generation": 4294967296}'),
        ("POST", "/v1/hosts/h1/place", b'{"space": "sp1", "generation": 1.5}'),
        ("POST", "/v1/hosts/h1/place", b'{"space": "../x", "generation": 1}'),
        ("POST", "/v1/hosts/h1/rotate", b'{"space": "sp1", "generation": 1, "lease": 1e400}'),
        ("GET", "/v1/hosts/h1/spaces/sp1?generation=" + "7" * 5000, b""),
        ("GET", "/v1/hosts/h1/spaces/sp1?generation=99999999999", b""),
        ("GET", "/v1/hosts/h1/spaces/sp1?generation=x", b""),
        ("GET", "/v1/hosts/h1/spaces/sp1?generation=1&generation=2", b""),
    ],
)
def test_malformed_numbers_are_answered_400_in_one_line(
    agent: HostAgent, certs: Any, method: str, path: str, body: bytes
) -> None:
    s: ClusterStore = certs.store
    s.create_space("sp1")
    client = certs.client("h1", agent.address)
    r = client._http.request(
        method, path, content=body or None, extensions={"sni_hostname": client.host.dns}
    )
    assert r.status_code == 400, r.text[:300]
    error = json.loads(r.content)["error"]
    assert "\n" not in error and len(error) < 300
    assert "Traceback" not in error and "Exceeds the limit" not in error
    assert s.space("sp1").state == "unplaced"


def test_a_body_over_the_limit_is_refused_unread(agent: HostAgent, certs: Any) -> None:
    client = certs.client("h1", agent.address)
    big = b'{"space": "sp1", "pad": "' + b"x" * (70 * 1024) + b'"}'
    r = client._http.post(
        "/v1/hosts/h1/place", content=big, extensions={"sni_hostname": client.host.dns}
    )
    assert r.status_code == 413 and "at most 65536 bytes" in r.json()["error"]
