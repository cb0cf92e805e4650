"""Transactions on PostgreSQL that outlive a database restart and a lost race.

Guarantees of ``Database.run(fn, *args)``:

- ``fn(conn, *args)`` runs inside one transaction; its value is returned only after the
  COMMIT succeeded, and whatever it raises rolls the transaction back.
- A serialization failure or a deadlock (another transaction won a race) runs ``fn``
  again from the start, at most ``conflict_attempts`` times in all; then
  ``ClusterConflictError``.
- A lost connection (the server stopped, restarted, or is still starting) is dropped
  and ``fn`` runs again on a new one until ``reconnect_secs`` have passed; then
  ``ClusterUnavailableError``. Errors and reprs name the host and database, never a
  password.
- A retry cannot know whether a COMMIT whose answer was lost took place. The store's
  transitions are written so that running one twice may burn a lease token or an epoch
  but never hands the same one out twice, and stores a run record once.
- One connection, one transaction at a time (a lock): threads may share a store; give
  each its own store to run transactions in parallel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import tenacity
from psycopg import IsolationLevel
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row

from durable_spaces.errors import ClusterConflictError, ClusterUnavailableError, ConfigError

T = TypeVar("T")
Conn = psycopg.Connection[DictRow]

_CONFLICTS = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)
#: admin_shutdown, crash_shutdown, cannot_connect_now (starting up or shutting down)
_SERVER_GOING = frozenset({"57P01", "57P02", "57P03"})


def connection_lost(e: BaseException) -> bool:
    """A failure of the connection rather than of the statement: retry on a new one."""
    if not isinstance(e, psycopg.OperationalError):
        return False
    state = e.sqlstate
    return state is None or state.startswith("08") or state in _SERVER_GOING


def describe(url: str) -> str:
    """``host:port/dbname`` of a libpq URL, without user or password. An empty URL is
    refused: libpq would take it for its default server, never the one meant."""
    if not url.strip():
        raise ConfigError("the cluster database URL is empty: give --db URL or DS_CLUSTER_DB")
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError as e:
        raise ConfigError("the cluster database URL is not a valid libpq URL") from e
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class Database:
    """One reconnecting connection to the cluster database (see the module doc)."""

    def __init__(
        self,
        url: str,
        *,
        reconnect_secs: float = 30.0,
        conflict_attempts: int = 5,
        connect_timeout: float = 5.0,
    ) -> None:
        self.where = describe(url)
        self._url = url
        self.reconnect_secs = reconnect_secs
        self.conflict_attempts = conflict_attempts
        self.connect_timeout = connect_timeout
        self._conn: Conn | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Database({self.where!r})"

    def close(self) -> None:
        with self._lock:
            self._drop()

    def run(self, fn: Callable[..., T], *args: Any, serializable: bool = False) -> T:
        """``fn(conn, *args)`` in one committed transaction (READ COMMITTED, or
        SERIALIZABLE when asked), retried as the module doc says."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, _CONFLICTS) or connection_lost(e)
            ),
            stop=self._stop,
            wait=tenacity.wait_exponential(multiplier=0.02, max=0.5)
            + tenacity.wait_random(0, 0.02),
            reraise=True,
        )
        try:
            return retrying(self._once, fn, args, serializable)
        except _CONFLICTS as e:
            raise ClusterConflictError(
                f"{fn.__name__}: still conflicting after {self.conflict_attempts} attempts"
            ) from e
        except psycopg.OperationalError as e:
            if connection_lost(e):
                raise ClusterUnavailableError(
                    f"PostgreSQL at {self.where} unreachable for {self.reconnect_secs:g}s "
                    f"({type(e).__name__})"
                ) from e
            raise

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        assert state.outcome is not None
        if isinstance(state.outcome.exception(), _CONFLICTS):
            return state.attempt_number >= self.conflict_attempts
        return (state.seconds_since_start or 0.0) >= self.reconnect_secs

    def _once(self, fn: Callable[..., T], args: tuple[Any, ...], serializable: bool) -> T:
        with self._lock:
            conn = self._connection()
            try:
                # Autocommit connection: conn.transaction() sends BEGIN with this level.
                conn.isolation_level = (
                    IsolationLevel.SERIALIZABLE if serializable else IsolationLevel.READ_COMMITTED
                )
                with conn.transaction():
                    return fn(conn, *args)
            except psycopg.Error:
                if conn.broken or conn.closed:
                    self._drop()
                raise

    def _connection(self) -> Conn:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._drop()
            self._conn = psycopg.connect(
                self._url,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=max(1, round(self.connect_timeout)),
                application_name="durable-spaces",
            )
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
