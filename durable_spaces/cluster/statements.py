"""The base of ``ClusterStore``: how a transition runs, and the events it appends.

The shape, after DBOS's system database: ``_foo_txn(conn, ...)`` runs inside a caller's
transaction and composes with other ``_txn`` methods; the public ``foo()`` runs it as
one transaction through ``Database.run`` (``durable_spaces/cluster/database.py``), so
every transition is exactly one transaction.

Guarantees:

- A refusal (a superseded lease token, a lost claim) is returned by its ``_txn`` as an
  exception *value*; ``_call`` raises it only after the transaction committed, so the
  ``ds.events`` row counting it is kept although the caller gets an error.
- Events are append-only (a trigger, ``durable_spaces/cluster/schema.py``) and carry no
  Space token: no ``_txn`` passes one to ``_event_txn``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

import psycopg
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from durable_spaces.cluster.database import Conn, Database
from durable_spaces.cluster.records import Event, check_json, check_name
from durable_spaces.errors import ClusterError

R = TypeVar("R")


def record(cls: type[R], row: dict[str, Any]) -> R:
    """A record dataclass from a row holding (at least) its fields."""
    return cls(**{f.name: row[f.name] for f in fields(cls)})  # type: ignore[arg-type]


def one(cursor: psycopg.Cursor[DictRow]) -> DictRow:
    """The row a statement cannot fail to return (it updates a row this transaction has
    locked, or reads one a conflict just proved is there)."""
    row = cursor.fetchone()
    if row is None:
        raise ClusterError("a row this transaction holds was not found (a bug)")
    return row


class Statements:
    """The plumbing every part of the store shares."""

    db: Database

    def _call(
        self, fn: Callable[..., Any], *args: Any, serializable: bool = False, **kwargs: Any
    ) -> Any:
        """Run ``fn`` as one transaction; raise the refusal it returned, once committed."""
        txn = functools.update_wrapper(functools.partial(fn, **kwargs), fn) if kwargs else fn
        out = self.db.run(txn, *args, serializable=serializable)
        if isinstance(out, Exception):
            raise out
        return out

    def _event_txn(
        self,
        conn: Conn,
        kind: str,
        *,
        session: str | None = None,
        space: str | None = None,
        host: str | None = None,
        **detail: Any,
    ) -> None:
        conn.execute(
            "INSERT INTO ds.events (kind, session, space, host, detail)"
            " VALUES (%s, %s, %s, %s, %s)",
            (kind, session, space, host, Jsonb(detail)),
        )

    def record_event(
        self,
        kind: str,
        *,
        session: str | None = None,
        space: str | None = None,
        host: str | None = None,
        **detail: Any,
    ) -> None:
        """Append a caller's own event (a driver's exit, say). Never put a token in it."""
        check_name("event kind", kind)
        detail = check_json("event detail", detail)
        self._call(self._event_txn, kind, session=session, space=space, host=host, **detail)

    def _events_txn(
        self, conn: Conn, kind: str | None, session: str | None, space: str | None, after: int
    ) -> list[Event]:
        rows = conn.execute(
            "SELECT * FROM ds.events WHERE id > %(after)s"
            " AND (%(kind)s::text IS NULL OR kind = %(kind)s)"
            " AND (%(session)s::text IS NULL OR session = %(session)s)"
            " AND (%(space)s::text IS NULL OR space = %(space)s) ORDER BY id",
            {"kind": kind, "session": session, "space": space, "after": after},
        ).fetchall()
        return [record(Event, r) for r in rows]

    def events(
        self,
        kind: str | None = None,
        *,
        session: str | None = None,
        space: str | None = None,
        after: int = 0,
    ) -> list[Event]:
        """Events in the order they were appended; ``after``: an event id to read on from."""
        return list(self._call(self._events_txn, kind, session, space, after))
