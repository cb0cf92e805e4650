"""A real private PostgreSQL for the cluster tests (durable_spaces/cluster/pgserver.py).

``pg_server``: one server per test process (xdist workers each start their own).
``pg_url``: a fresh empty database on it for each test. ``private_pg``: a server of the
test's own, for tests that stop, crash or restart it. ``stores``: opens ClusterStores on
``pg_url`` (each with its own connection, as separate coordinators would) and closes them.
``certs``: the test's cluster CA in that database, and the certificates it issues
(``tls_lab.py``).
Every test here skips, naming what is missing, when PostgreSQL's binaries are not
installed (images/postgres/ci-setup.sh installs them).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from needs import need

from durable_spaces.cluster import pgserver
from durable_spaces.cluster.store import ClusterStore

OpenStore = Callable[..., ClusterStore]


def _need_postgres() -> None:
    need("postgres")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgserver.PgServer]:
    _need_postgres()
    with pgserver.PgServer() as pg:
        yield pg


@pytest.fixture
def pg_url(pg_server: pgserver.PgServer) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    url = pg_server.create_database(name)
    yield url
    pg_server.drop_database(name)


@pytest.fixture
def certs(pg_url: str, tmp_path: Any) -> Iterator[Any]:
    from tls_lab import TestPki

    with ClusterStore(pg_url) as store:
        yield TestPki(store, tmp_path / "pki")


@pytest.fixture
def private_pg() -> Iterator[pgserver.PgServer]:
    _need_postgres()
    with pgserver.PgServer() as pg:
        yield pg


@pytest.fixture
def stores(pg_url: str) -> Iterator[OpenStore]:
    opened: list[ClusterStore] = []

    def open_store(url: str | None = None, **kw: Any) -> ClusterStore:
        s = ClusterStore(url or pg_url, **kw)
        opened.append(s)
        return s

    yield open_store
    for s in opened:
        s.close()


def _need_hosts() -> None:
    """Hosts in network namespaces with real cua-spacesd: skip, naming what is missing."""
    for name in ("postgres", "netns", "spacesd"):
        need(name)


@pytest.fixture
def netns_lab() -> Iterator[Any]:
    """A bridge and namespaces made for this test, removed after it (failed or not)."""
    from durable_spaces.campaigns.cluster import netns

    _need_hosts()
    netns.sweep_stale()  # what a killed earlier run left behind
    with netns.NetnsLab() as lab:
        yield lab


def _cluster(url: str, tmp_path: Any, lab: Any) -> Iterator[Any]:
    from durable_spaces.campaigns.cluster.lab import Cluster

    c = Cluster(url, tmp_path, lab)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def cluster(pg_url: str, tmp_path: Any, netns_lab: Any) -> Iterator[Any]:
    """Hosts, coordinators and sessions on a fresh database (``clusterlab.Cluster``)."""
    yield from _cluster(pg_url, tmp_path, netns_lab)


@pytest.fixture
def restartable_cluster(
    private_pg: pgserver.PgServer, tmp_path: Any, netns_lab: Any
) -> Iterator[Any]:
    """A cluster on a PostgreSQL of the test's own (``.pg``: it stops and starts it)."""
    for c in _cluster(private_pg.url(), tmp_path, netns_lab):
        c.pg = private_pg
        yield c
