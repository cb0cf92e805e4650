"""``ClusterStore``: the cluster's state in PostgreSQL, the one class owning its SQL.

It is assembled from one part per group of tables, each a module with its own
guarantees: ``placement.py`` (hosts, durable Spaces), ``leases.py``, ``sessions.py``
(claims, epochs, drives), ``queue.py`` (the campaign run queue), ``certificates.py``
(the cluster CA's certificate, what it issued and revoked), on the plumbing of
``statements.py`` (DBOS style: ``_foo_txn(conn, ...)`` inside a caller's transaction,
public ``foo()`` as one transaction; refusals are counted in ``ds.events`` and raised
after commit). ``database.py`` runs the transactions: retried on a lost race, run again
on a new connection while the database restarts.

Concurrency, in one place:

- READ COMMITTED with explicit row locks wherever a transition decides on rows it can
  lock: a lease (``FOR UPDATE`` on its row: acquirers queue, and after the wait see the
  newest version), a session's or run's claim (``FOR UPDATE SKIP LOCKED``: claimers pass
  over each other, and a claim committed meanwhile fails the re-checked WHERE).
- SERIALIZABLE where a transition decides on a predicate over many rows: the lost-host
  sweep and placement (``PlacementStatements.mark_lost_hosts`` says why).
- Locks are taken session, then lease, then Space, so transitions do not deadlock each
  other; a deadlock or serialization failure is retried a few times (``Database``).
- All times are the database's (``now()``): machines' clocks need not agree.
"""

from __future__ import annotations

from types import TracebackType

from durable_spaces.cluster.certificates import CertificateStatements
from durable_spaces.cluster.database import Conn, Database
from durable_spaces.cluster.placement import PlacementStatements
from durable_spaces.cluster.queue import RunQueueStatements
from durable_spaces.cluster.schema import DDL, MIGRATE_1_TO_2, MIGRATE_2_TO_3, VERSION
from durable_spaces.cluster.sessions import SessionStatements
from durable_spaces.cluster.statements import one
from durable_spaces.errors import ClusterConflictError


class ClusterStore(
    SessionStatements, PlacementStatements, RunQueueStatements, CertificateStatements
):
    """The cluster's shared state at ``url``, a libpq URL (e.g. ``PgServer.url()``).

    ``reconnect_secs``: how long a transition keeps trying while the database is
    unreachable before ``ClusterUnavailableError``. ``create``: create the schema when
    the database has none (safe when many stores start at once).
    """

    def __init__(self, url: str, *, reconnect_secs: float = 30.0, create: bool = True) -> None:
        self.db = Database(url, reconnect_secs=reconnect_secs)
        if create:
            self._call(self._ensure_schema_txn)

    def __repr__(self) -> str:
        return f"ClusterStore({self.db.where!r})"

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> ClusterStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _ensure_schema_txn(self, conn: Conn) -> int | Exception:
        # Stores starting together would race on CREATE: one creator at a time.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('ds.schema'))")
        if one(conn.execute("SELECT to_regclass('ds.meta') AS t"))["t"] is None:
            for statement in DDL:
                conn.execute(statement)
            conn.execute("INSERT INTO ds.meta (version) VALUES (%s)", (VERSION,))
            return VERSION
        version = int(one(conn.execute("SELECT version FROM ds.meta"))["version"])
        steps = {1: MIGRATE_1_TO_2, 2: MIGRATE_2_TO_3}
        if version in steps:
            while version in steps:
                for statement in steps[version]:
                    conn.execute(statement)
                version += 1
            return VERSION
        if version != VERSION:
            return ClusterConflictError(
                f"cluster schema version {version} in {self.db.where}; this code has {VERSION}"
            )
        return version
