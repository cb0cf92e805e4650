"""The host API against a client that is not the cluster's (durable_spaces/cluster/hostapi.py
and hostauth.py): unsigned and wrongly signed requests refused before anything happens, a
rotated secret taken, malformed numbers answered 400 in one line, and slow clients held
by a bounded pool with socket timeouts (threads counted with psutil, no time bounds)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from durable_spaces.campaigns.cluster.lab import wait_for
from durable_spaces.cluster.host import HostAgent
from durable_spaces.cluster.hostapi import HostApiServer, HostClient
from durable_spaces.cluster.hostauth import HostSecret, sign
from durable_spaces.cluster.records import Secret
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import HostApiError, HostAuthError
from durable_spaces.host.ports import free_port


@pytest.fixture
def agent(pg_url: str, tmp_path: Path) -> Iterator[HostAgent]:
    a = HostAgent(
        pg_url,
        "h1",
        f"127.0.0.1:{free_port()}",
        "local",
        tmp_path / "h1",
        heartbeat_secs=0.2,
        sweep_secs=0.3,
    )
    t = threading.Thread(target=asyncio.run, args=(a.run(),), daemon=True)
    t.start()
    secret = ClusterStore(pg_url).host_secrets()[0]
    wait_for("the agent's API", lambda: _answers(a.address, secret))
    yield a
    assert a._loop is not None
    a._loop.call_soon_threadsafe(a.stopping.set)
    t.join(20)


def _answers(address: str, secret: HostSecret) -> bool:
    try:
        HostClient(address, secret).status("x", 1)
    except (HostApiError, HostAuthError):  # not up yet, or not reading that secret yet
        return False
    return True


def _raw(
    address: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """One request as bytes on a socket: the status code and the body."""
    head = [f"{method} {path} HTTP/1.1", f"Host: {address}", "Connection: close"]
    hdrs = {"Content-Length": str(len(body))} if body or method == "POST" else {}
    hdrs.update(headers or {})
    head += [f"{k}: {v}" for k, v in hdrs.items()]
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


def _signed(secret: HostSecret, method: str, path: str, body: bytes = b"") -> dict[str, str]:
    return {"Authorization": sign(secret, method, path, body)}


def test_an_unauthenticated_place_is_refused_and_places_nothing(
    agent: HostAgent, stores: Any
) -> None:
    s: ClusterStore = stores()
    s.create_space("sp1")
    body = json.dumps({"space": "sp1", "generation": 1}).encode()
    status, answer = _raw(agent.address, "POST", "/v1/place", body)
    assert status == 401, answer
    assert b"not authenticated" in answer
    assert s.space("sp1").state == "unplaced"
    assert agent.backend_name == "local" and not list((agent.state_dir / "spaces").glob("dsc*"))


def test_a_wrong_secret_or_a_forged_header_is_refused(agent: HostAgent, stores: Any) -> None:
    s: ClusterStore = stores()
    s.create_space("sp1")
    wrong = HostSecret(s.host_secrets()[0].version, Secret("x" * 43))
    with pytest.raises(HostAuthError, match="does not match"):
        HostClient(agent.address, wrong).place("sp1", 1)
    unknown = HostSecret(99, Secret("x" * 43))
    with pytest.raises(HostAuthError, match="not accepted"):
        HostClient(agent.address, unknown).place("sp1", 1)
    body = json.dumps({"space": "sp1", "generation": 1}).encode()
    right = s.host_secrets()[0]
    # A signature of another body (a replay with its body changed) does not pass.
    other = _signed(right, "POST", "/v1/place", b'{"space": "sp1", "generation": 2}')
    assert _raw(agent.address, "POST", "/v1/place", body, other)[0] == 401
    assert _raw(agent.address, "POST", "/v1/place", body, {"Authorization": "Bearer x"})[0] == 401
    assert s.space("sp1").state == "unplaced"
    HostClient(agent.address, right).place("sp1", 1)  # the cluster's own caller
    assert s.space("sp1").state == "ready"


def test_status_tells_an_unauthenticated_client_nothing(agent: HostAgent, stores: Any) -> None:
    s: ClusterStore = stores()
    s.create_space("sp1")
    secret = s.host_secrets()[0]
    placed = HostClient(agent.address, secret).place("sp1", 1)
    status, answer = _raw(agent.address, "GET", "/v1/spaces/sp1?generation=1")
    assert status == 401
    assert b"boot" not in answer and b"local" not in answer
    assert str(agent.state_dir).encode() not in answer
    assert placed["address"].encode() not in answer
    assert HostClient(agent.address, secret).status("sp1", 1)["state"] == "up"


def test_a_rotated_secret_is_taken_and_the_one_before_it_still_passes(
    agent: HostAgent, stores: Any
) -> None:
    s: ClusterStore = stores()
    first = s.host_secrets()[0]
    second_version = s.rotate_host_secret()
    second = s.host_secrets()[0]
    assert second.version == second_version != first.version
    wait_for("the agent to read it", lambda: _answers(agent.address, second))
    assert _answers(agent.address, first)  # callers that did not read it yet
    s.rotate_host_secret()
    third = s.host_secrets()[0]
    wait_for("the agent to read the third", lambda: _answers(agent.address, third))
    with pytest.raises(HostAuthError, match="not accepted"):
        HostClient(agent.address, first).status("x", 1)


@pytest.mark.parametrize(
    ("method", "path", "body", "length"),
    [
        ("POST", "/v1/place", b'{"space": "sp1", "generation": 1}', "abc"),
        ("POST", "/v1/place", b'{"space": "sp1", "generation": 1}', "-5"),
        ("POST", "/v1/place", b'{"space": "sp1", "generation": 1}', "9" * 5000),
        ("POST", "/v1/place", b'{"space": "sp1", "generation": ' + b"7" * 5000 + b"}", None),
        ("POST", "/v1/place", b'{"space": "sp1", "generation": ' + b"7" * 4000 + b"}", None),
        ("POST", "/v1/place", b'{"space": "sp1", "generation": 4294967296}', None),
        ("POST", "/v1/place", b'{"space": "sp1", "generation": 1.5}', None),
        ("POST", "/v1/rotate", b'{"space": "sp1", "generation": 1, "lease": 1e400}', None),
        ("GET", "/v1/spaces/sp1?generation=" + "7" * 5000, b"", None),
        ("GET", "/v1/spaces/sp1?generation=99999999999", b"", None),
        ("GET", "/v1/spaces/sp1?generation=x", b"", None),
    ],
)
def test_malformed_numbers_are_answered_400_in_one_line(
    agent: HostAgent, stores: Any, method: str, path: str, body: bytes, length: str | None
) -> None:
    s: ClusterStore = stores()
    s.create_space("sp1")
    headers = _signed(s.host_secrets()[0], method, path, body)
    if length is not None:
        headers["Content-Length"] = length
    status, answer = _raw(agent.address, method, path, body, headers)
    assert status == 400, answer[:300]
    error = json.loads(answer)["error"]
    assert "\n" not in error and len(error) < 300
    assert "Traceback" not in error and "Exceeds the limit" not in error
    assert s.space("sp1").state == "unplaced"


class _Slow:
    """A service that only answers; the API's pool is what is measured."""

    def __init__(self, secret: HostSecret) -> None:
        self.secret = secret

    def accepted_secrets(self) -> list[HostSecret]:
        return [self.secret]

    def place(self, space: str, generation: int) -> dict[str, Any]:
        return {"address": "x", "generation": generation}

    def rotate(self, space: str, generation: int, lease: int) -> dict[str, Any]:
        return {"rotated": False}

    def status(self, space: str, generation: int) -> dict[str, Any]:
        return {"state": "unknown", "boot": None}


def test_slow_clients_time_out_and_do_not_make_a_thread_each() -> None:
    secret = HostSecret(1, Secret("s" * 43))
    address = f"127.0.0.1:{free_port()}"
    me = psutil.Process()
    before = me.num_threads()
    # The timeout outlasts the connecting below on a loaded machine: the slow clients are
    # all there at once, as an attacker's would be.
    api = HostApiServer(address, _Slow(secret), workers=8, queued=16, request_timeout=4.0)
    api.start()
    try:
        host, port = address.rsplit(":", 1)
        socks = []
        peak = 0
        for _ in range(400):  # each promises a body that never comes
            c = socket.create_connection((host, int(port)))
            c.sendall(b"POST /v1/place HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
            socks.append(c)
            peak = max(peak, me.num_threads())
        # the pool, its accept loop and the reaper of late requests
        assert peak <= before + 8 + 2, (before, peak)

        def all_cut() -> bool:
            for c in socks:
                c.settimeout(0.01)
                try:
                    if c.recv(1) != b"":
                        return False
                except TimeoutError:
                    return False
                except OSError:
                    pass  # reset: cut too
            return True

        wait_for("every slow client to be cut", all_cut, 120)
        assert me.num_threads() <= before + 8 + 2
        for c in socks:
            c.close()
        assert HostClient(address, secret).status("sp", 1)["state"] == "unknown"
    finally:
        api.close()


def test_a_client_trickling_its_headers_is_cut() -> None:
    secret = HostSecret(1, Secret("s" * 43))
    address = f"127.0.0.1:{free_port()}"
    api = HostApiServer(address, _Slow(secret), workers=2, queued=4, request_timeout=1.0)
    api.start()
    try:
        host, port = address.rsplit(":", 1)
        c = socket.create_connection((host, int(port)))
        head = b"GET /v1/spaces/sp?generation=1 HTTP/1.1\r\nX-Slow: " + b"a" * 10_000
        cut = threading.Event()

        def trickle() -> None:  # a byte well within every read's timeout, forever
            for b in head:
                try:
                    c.sendall(bytes([b]))
                except OSError:
                    cut.set()
                    return
                if cut.wait(0.2):
                    return

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        c.settimeout(None)
        with contextlib.suppress(ConnectionResetError):  # the server shut it: no answer
            assert c.recv(1) == b""
        cut.set()
        t.join()
        c.close()
        assert HostClient(address, secret).status("sp", 1)["state"] == "unknown"
    finally:
        api.close()
