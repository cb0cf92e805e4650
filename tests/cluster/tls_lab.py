"""What the cluster tests need of TLS: a CA of the test's own and its certificates
(``durable_spaces/cluster/enrol.py``, as the operator would make them), a host agent in
this process, and a listener served from a loop of its own thread."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from durable_spaces.campaigns.cluster.lab import wait_for
from durable_spaces.cluster import enrol
from durable_spaces.cluster.host import HostAgent
from durable_spaces.cluster.hostapi import HostClient
from durable_spaces.cluster.hostserver import App, Limits, Listener
from durable_spaces.cluster.pki import CLIENT_ROLES, Authority, identity
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.cluster.tls import Trust
from durable_spaces.errors import HostApiError
from durable_spaces.host.ports import free_port

T = TypeVar("T")


class TestPki:
    """The test's cluster CA (in ``root/ca``) and the certificates it issues."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, store: ClusterStore, root: Path) -> None:
        self.store = store
        self.root = root
        enrol.init(store, root / "ca")
        self.ca_dir = root / "ca"
        self.ca: Authority = enrol.load_authority(self.ca_dir)

    def enrol(
        self,
        role: str,
        id_: str,
        *,
        days: int = 365,
        not_before: dt.datetime | None = None,
        name: str | None = None,
    ) -> Path:
        """A TLS directory holding a new certificate of ``role`` ``id_``."""
        d = self.root / "tls" / (name or f"{role}-{id_}")
        enrol.enrol_here(
            self.store, self.ca, d, identity(role, id_), days=days, not_before=not_before
        )
        return d

    def trust(self, role: str, id_: str, **kw: Any) -> Trust:
        t = Trust(self.enrol(role, id_, **kw))
        t.refresh(self.store)
        return t

    def client(self, host_id: str, address: str, who: str = "c1", **kw: Any) -> HostClient:
        return HostClient(address, host_id, self.trust("coordinator", who), **kw)


class LoopThread:
    """An event loop on a thread of its own, for servers the test talks to from here."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


@contextmanager
def served(
    app: App,
    trust: Trust,
    limits: Limits | None = None,
    address: str | None = None,
    roles: tuple[str, ...] = CLIENT_ROLES,
) -> Iterator[Listener]:
    """``app`` served with mutual TLS on ``address`` (default: a free loopback port) to
    ``roles``, closed after."""
    loop = LoopThread()
    listener = Listener(
        address or f"127.0.0.1:{free_port()}", app, trust, limits=limits, roles=roles
    )
    loop.run(listener.start())
    try:
        yield listener
    finally:
        loop.run(listener.close())
        loop.close()


def answers(client: HostClient) -> bool:
    try:
        client.status("x", 1)
    except HostApiError:
        return False
    return True


@contextmanager
def running_agent(
    url: str,
    state_dir: Path,
    tls_dir: Path,
    host_id: str = "h1",
    address: str | None = None,
    **kw: Any,
) -> Iterator[HostAgent]:
    """A host agent (``local`` backend) serving on ``address`` (default: a free loopback
    port), stopped after."""
    kw.setdefault("sweep_secs", 0.3)
    kw.setdefault("heartbeat_secs", 0.2)
    address = address or f"127.0.0.1:{free_port()}"
    a = HostAgent(url, host_id, address, "local", state_dir, tls_dir=tls_dir, **kw)
    t = threading.Thread(target=asyncio.run, args=(a.run(),), daemon=True)
    t.start()
    try:
        wait_for("the agent's API", lambda: a.api is not None and a.api._sock is not None)
        yield a
    finally:
        assert a._loop is not None
        a._loop.call_soon_threadsafe(a.stopping.set)
        t.join(30)
