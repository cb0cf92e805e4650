"""The ``remote`` backend in a driver process of its own: its lease kept (a superseded
token stops the process, fenced) and a Space the cluster moved on from halting a call
that would never return."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from durable_spaces.campaigns.cluster.lab import wait_for
from durable_spaces.cluster.address import SpacesdAddress
from durable_spaces.cluster.remote import RemoteBackend
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import ConfigError

DRIVER = textwrap.dedent(
    """
    import asyncio, sys
    from durable_spaces.cluster.remote import RemoteBackend

    async def main():
        space = await RemoteBackend(sys.argv[1]).find("sp")
        print("found", space, flush=True)
        await space.read_file("f.txt")  # the daemon accepts and never answers
        print("answered", flush=True)

    asyncio.run(main())
    """
)


class Blackhole:
    """A port that takes connections and never says anything (a hung machine); counts
    the connections it took."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.taken: list[socket.socket] = []
        threading.Thread(target=self._take, daemon=True).start()

    def _take(self) -> None:
        while True:
            try:
                self.taken.append(self._sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self._sock.close()
        for c in self.taken:
            c.close()


@pytest.fixture
def blackhole() -> Iterator[int]:
    """The port of a hung daemon (and, in another, of its hung host: ``hung_host``)."""
    daemon = Blackhole()
    host = Blackhole()
    _HOLES[daemon.port] = (daemon, host)
    yield daemon.port
    daemon.close()
    host.close()


_HOLES: dict[int, tuple[Blackhole, Blackhole]] = {}


def _drive(s: ClusterStore, url: str, port: int, tmp: Any, certs: Any) -> subprocess.Popen[str]:
    host = _HOLES[port][1].port
    s.register_host("h1", f"127.0.0.1:{host}", "spacesd")
    s.create_space("sp")
    addr = SpacesdAddress(f"127.0.0.1:{port}", "/w", "i1", f"127.0.0.1:{host}")
    s.place_space("sp", 1, "h1", addr.format(), "tok")
    s.create_session("a", "sp")
    s.claim_session("c1", 60, "a")
    d = s.begin_drive("a", "c1")
    assert d.lease_token is not None
    s.set_space_token("sp", 1, "h1", d.lease_token, "tok")  # its host's rotation
    env = dict(
        os.environ,
        CUA_CLUSTER_DB=url,
        CUA_SESSION_NAME="a",
        CUA_SESSION_LEASE_TOKEN=str(d.lease_token),
        CUA_SESSION_HEARTBEAT_SECS="0.3",
        CUA_CLUSTER_TLS_DIR=str(certs.enrol("coordinator", "c1")),
    )
    p = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    assert p.stdout.readline().startswith("found")
    return p


def test_a_driver_on_a_space_the_cluster_moved_on_from_halts(
    stores: Any, pg_url: str, blackhole: int, tmp_path: Any, certs: Any
) -> None:
    s = stores()
    p = _drive(s, pg_url, blackhole, tmp_path, certs)
    daemon = _HOLES[blackhole][0]
    wait_for("the driver's call to reach the daemon", lambda: daemon.taken, 60)
    assert p.poll() is None  # hung in its call, as against a frozen host
    s.space_lost("sp", 1, "host h1 lost", host="h1")
    t0 = time.monotonic()
    try:  # well before the SDK's own request timeout (about 30 s) would end the call
        _, err = p.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the driver kept waiting on a Space the cluster had moved on from")
    assert p.returncode == 1, err
    assert "Space sp generation 1 is gone from the cluster" in err
    print(f"halted {time.monotonic() - t0:.2f} s after the store moved on")


def test_a_superseded_lease_fences_the_driver(
    stores: Any, pg_url: str, blackhole: int, tmp_path: Any, certs: Any
) -> None:
    s = stores()
    p = _drive(s, pg_url, blackhole, tmp_path, certs)
    s.begin_drive("a", "c1")  # a newer drive: token 2
    _, err = p.communicate(timeout=30)
    assert p.returncode == 75, err
    assert "superseded by token 2" in err
    refused = s.events("lease_refused")
    assert [(e.detail["op"], e.detail["token"]) for e in refused] == [("renew", 1)]


def test_missing_environment_is_a_config_error_naming_it(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="CUA_CLUSTER_DB"):
        RemoteBackend(tmp_path, env={})
    with pytest.raises(ConfigError, match="CUA_SESSION_LEASE_TOKEN"):
        RemoteBackend(
            tmp_path,
            env={"CUA_CLUSTER_DB": "postgresql:///x", "CUA_SESSION_NAME": "a",
                 "CUA_SESSION_LEASE_TOKEN": "one"},
        )  # fmt: skip


def test_a_driver_imports_no_server_and_no_command_line_client() -> None:
    # every driver imports the remote backend at its start: the host's server libraries
    # and httpx's own command-line client (rich, click) are no part of what it needs
    code = (
        "import sys, durable_spaces.cluster.remote, durable_spaces.cluster.placer\n"
        "print(sorted(m for m in ('starlette', 'uvicorn', 'httpx._main', 'rich', 'click')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
