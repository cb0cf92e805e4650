"""The host agent on its own (in this process, ``local`` backend, loopback): its API, the
report of a sandbox that is gone, and dropping everything once declared lost."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from needs import need
from tls_lab import answers, running_agent

from durable_spaces.campaigns.cluster.lab import wait_for
from durable_spaces.cluster.address import LocalAddress, parse_address
from durable_spaces.cluster.host import HostAgent, local_name
from durable_spaces.cluster.hostapi import HostClient
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import (
    ClusterConflictError,
    ConfigError,
    HostApiError,
    UnknownRecordError,
)
from durable_spaces.host.ports import free_port

_CLIENTS: dict[str, HostClient] = {}  # an agent's address: a coordinator's client of it


@pytest.fixture
def agent(pg_url: str, tmp_path: Path, certs: Any) -> Iterator[HostAgent]:
    with running_agent(pg_url, tmp_path / "h1", certs.enrol("host", "h1")) as a:
        _CLIENTS[a.address] = certs.client("h1", a.address)
        wait_for("the agent's API", lambda: answers(_CLIENTS[a.address]))
        yield a


def _client(agent: HostAgent) -> HostClient:
    return _CLIENTS[agent.address]


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


def test_a_host_that_lost_its_state_reports_what_the_store_placed_on_it(
    pg_url: str, tmp_path: Path, certs: Any
) -> None:
    """Its own word, under its own lock: the one way (besides its heartbeat lapsing) a
    Space the store placed on it is declared lost."""
    s: ClusterStore = certs.store
    tls = certs.enrol("host", "h1")
    with running_agent(pg_url, tmp_path / "h1", tls) as a:
        client = certs.client("h1", a.address)
        wait_for("its API", lambda: answers(client))
        s.create_space("sp")
        client.place("sp", 1)
        s.create_space("kept")
        client.place("kept", 1)
    provided = json.loads((tmp_path / "h1" / "provided.json").read_text())
    del provided[local_name("sp", 1)]  # its record of one placement is gone (a bad disk)
    (tmp_path / "h1" / "provided.json").write_text(json.dumps(provided))
    with running_agent(pg_url, tmp_path / "h1", tls, address=a.address):
        wait_for("its report", lambda: s.space("sp").generation == 2, 30)
        ev = s.events("space_unplaced")[-1]
        assert (ev.space, ev.host) == ("sp", "h1")
        assert ev.detail["reason"] == "not provided (state lost) on host h1"
        kept = s.space("kept")
        assert (kept.state, kept.generation, kept.host_id) == ("ready", 1, "h1")


def test_bad_requests_are_typed_errors(agent: HostAgent, certs: Any) -> None:
    client = _client(agent)
    r = client._http.post(
        "/v1/hosts/h1/place", content=b"[1]", extensions={"sni_hostname": client.host.dns}
    )
    assert r.status_code == 400 and "JSON object" in r.json()["error"]
    with pytest.raises(ConfigError, match="space"):
        client.place("../x", 1)
    with pytest.raises(HostApiError, match="did not answer"):
        certs.client("h1", f"127.0.0.1:{free_port()}", timeout=0.5).status("sp", 1)


def test_a_spacesd_listen_host_must_be_an_ipv4_address(tmp_path: Path) -> None:
    from durable_spaces.backends.spacesd import SpacesdBackend

    need("spacesd")
    assert SpacesdBackend(tmp_path, listen_host="10.77.0.2").listen_host == "10.77.0.2"
    with pytest.raises(ConfigError, match="listen_host"):
        SpacesdBackend(tmp_path, listen_host="0.0.0.0 --token x")
