"""A real private PostgreSQL for the cluster tests (durable_spaces/cluster/pgserver.py).

``pg_server``: one server per test process (xdist workers each start their own).
``pg_url``: a fresh empty database on it for each test. ``private_pg``: a server of the
test's own, for tests that stop, crash or restart it. ``stores``: opens ClusterStores on
``pg_url`` (each with its own connection, as separate coordinators would) and closes them.
Every test here skips, naming what is missing, when PostgreSQL's binaries are not
installed (images/postgres/ci-setup.sh installs them).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from durable_spaces.cluster import pgserver
from durable_spaces.cluster.store import ClusterStore

OpenStore = Callable[..., ClusterStore]


def _need_postgres() -> None:
    reason = pgserver.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


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
