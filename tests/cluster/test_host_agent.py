"""The host agent on its own (in this process, ``local`` backend, loopback): its API, the
report of a sandbox that is gone, and dropping everything once declared lost."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from needs import need

from durable_spaces.campaigns.cluster.lab import wait_for
from durable_spaces.cluster.address import LocalAddress, parse_address
from durable_spaces.cluster.host import HostAgent, local_name
from durable_spaces.cluster.hostapi import HostClient
from durable_spaces.cluster.hostauth import HostSecret, sign
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import (
    ClusterConflictError,
    ConfigError,
    HostApiError,
    UnknownRecordError,
)
from durable_spaces.host.ports import free_port


@pytest.fixture
def agent(pg_url: str, tmp_path: Path) -> Iterator[HostAgent]:
    a = HostAgent(
        pg_url, "h1", f"127.0.0.1:{free_port()}", "local", tmp_path / "h1", sweep_secs=0.3
    )
    t = threading.Thread(target=asyncio.run, args=(a.run(),), daemon=True)
    t.start()
    _URLS[a.address] = pg_url
    wait_for("the agent's API", lambda: _answers(a.address, _secret(pg_url)))
    yield a
    assert a._loop is not None
    a._loop.call_soon_threadsafe(a.stopping.set)
    t.join(20)


def _secret(url: str) -> HostSecret:
    with ClusterStore(url) as s:
        return s.host_secrets()[0]


_URLS: dict[str, str] = {}  # an agent's address: its store's URL


def _client(agent: HostAgent) -> HostClient:
    return HostClient(agent.address, _secret(_URLS[agent.address]))


def _answers(address: str, secret: HostSecret) -> bool:
    try:
        HostClient(address, secret).status("x", 1)
    except HostApiError:
        return False
    return True


def _placed_sandbox(agent: HostAgent, s: ClusterStore) -> Path:
    """Durable Space ``sp`` placed on the agent: its sandbox directory."""
    s.create_space("sp")
    addr = parse_address(_client(agent).place("sp", 1)["address"])
    assert isinstance(addr, LocalAddress)
    sandbox = Path(addr.state_dir) / addr.name
    assert sandbox.is_dir()
    return sandbox


def test_places_only_a_generation_waiting_and_reports_a_removed_sandbox(
    agent: HostAgent, stores: Any
) -> None:
    s: ClusterStore = stores()
    client = _client(agent)
    with pytest.raises(UnknownRecordError):  # no such space in the store
        client.place("nope", 1)
    s.create_space("sp")
    with pytest.raises(ClusterConflictError, match="generation 2 is not waiting"):
        client.place("sp", 2)
    answer = client.place("sp", 1)
    assert client.place("sp", 1) == answer  # a repeat answers the same placement
    sp = s.space("sp")
    assert (sp.state, sp.host_id, sp.address) == ("ready", "h1", answer["address"])
    addr = parse_address(answer["address"])
    assert isinstance(addr, LocalAddress) and addr.name == local_name("sp", 1)
    assert client.status("sp", 1)["state"] == "up"
    assert client.status("sp", 2)["state"] == "unknown"
    shutil.rmtree(Path(addr.state_dir) / addr.name)  # someone removed the sandbox
    assert client.status("sp", 1)["state"] == "gone"
    sp = s.space("sp")
    assert (sp.state, sp.generation, sp.restored_from) == ("unplaced", 2, "from-scratch")
    assert sp.placement_reason == "the sandbox was removed on host h1"
    client.place("sp", 2)  # the next generation is a new sandbox
    assert s.space("sp").host_id == "h1"


def test_the_sweep_reports_a_removed_sandbox_without_being_asked(
    agent: HostAgent, stores: Any
) -> None:
    s: ClusterStore = stores()
    shutil.rmtree(_placed_sandbox(agent, s))
    wait_for("the sweep's report", lambda: s.space("sp").state == "unplaced", 10)
    assert s.events("space_unplaced")[-1].detail["reason"] == "the sandbox is gone on host h1"


def test_a_host_declared_lost_drops_its_spaces_and_registers_again(
    agent: HostAgent, stores: Any
) -> None:
    s: ClusterStore = stores()
    sandbox = _placed_sandbox(agent, s)
    agent.sweep_secs = 3600.0  # the drop below is the heartbeat's doing, not the sweep's
    time.sleep(0.6)

    def silent_then_swept(conn: Any) -> list[str]:
        # one transaction: the agent's next heartbeat cannot slip in between
        conn.execute("UPDATE ds.hosts SET heartbeat_at = now() - interval '1 h'")
        return s._mark_lost_hosts_txn(conn, 0.5)

    assert s.db.run(silent_then_swept) == ["h1"]
    wait_for("the agent to register again", lambda: len(s.events("host_registered")) == 2, 10)
    assert s.hosts()[0].state == "up"
    wait_for("its sandbox to be dropped", lambda: not sandbox.exists(), 10)
    assert s.space("sp").state == "unplaced"  # waiting for a placement, anywhere


def test_bad_requests_are_typed_errors(agent: HostAgent) -> None:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://{agent.address}/v1/place", data=b"[1]", method="POST")
    secret = _secret(_URLS[agent.address])
    req.add_header("Authorization", sign(secret, "POST", "/v1/place", b"[1]"))
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 400
    with pytest.raises(ConfigError, match="space"):
        _client(agent).place("../x", 1)
    with pytest.raises(HostApiError, match="did not answer"):
        HostClient(f"127.0.0.1:{free_port()}", secret, timeout=0.5).status("sp", 1)


def test_a_spacesd_listen_host_must_be_an_ipv4_address(tmp_path: Path) -> None:
    from durable_spaces.backends.spacesd import SpacesdBackend

    need("spacesd")
    assert SpacesdBackend(tmp_path, listen_host="10.77.0.2").listen_host == "10.77.0.2"
    with pytest.raises(ConfigError, match="listen_host"):
        SpacesdBackend(tmp_path, listen_host="0.0.0.0 --token x")
