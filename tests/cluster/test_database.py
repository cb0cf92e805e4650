"""The transaction runner (durable_spaces/cluster/database.py): isolation levels, the
bounded retry of lost races, no retry of real errors."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from durable_spaces.cluster.database import Database
from durable_spaces.errors import ClusterConflictError


def test_transactions_run_read_committed_unless_serializable_is_asked(pg_url: str) -> None:
    db = Database(pg_url)

    def level(conn: Any) -> str:
        return str(conn.execute("SHOW transaction_isolation").fetchone()["transaction_isolation"])

    assert db.run(level) == "read committed"
    assert db.run(level, serializable=True) == "serializable"
    assert db.run(level) == "read committed"
    db.close()


def test_a_lost_race_is_run_again_and_a_persistent_one_gives_up(pg_url: str) -> None:
    db = Database(pg_url, conflict_attempts=4)
    db.run(lambda c: c.execute("CREATE TABLE n (v int)"))
    calls = {"n": 0}

    def flaky(conn: Any) -> int:
        calls["n"] += 1
        conn.execute("INSERT INTO n VALUES (%s)", (calls["n"],))
        if calls["n"] < 3:
            raise pg_errors.SerializationFailure("lost the race")
        return calls["n"]

    assert db.run(flaky) == 3
    # the two failed attempts were rolled back: only the third one's row is there
    assert db.run(lambda c: [r["v"] for r in c.execute("SELECT v FROM n")]) == [3]

    calls["n"] = -100
    with pytest.raises(ClusterConflictError, match="after 4 attempts"):
        db.run(flaky)
    assert calls["n"] == -96

    def broken(conn: Any) -> None:
        calls["n"] += 1
        conn.execute("INSERT INTO nope VALUES (1)")

    calls["n"] = 0
    with pytest.raises(psycopg.errors.UndefinedTable):
        db.run(broken)
    assert calls["n"] == 1  # a real error is not retried
    db.close()


def test_a_version_1_database_is_migrated_with_a_host_secret(stores: Any) -> None:
    s = stores()

    def as_version_1(conn: Any) -> None:  # what the older code made
        conn.execute("DROP TABLE ds.host_secrets")
        conn.execute("ALTER TABLE ds.spaces DROP COLUMN token_lease")
        conn.execute("UPDATE ds.meta SET version = 1")

    s.db.run(as_version_1)
    again = stores()
    assert (
        again.db.run(lambda c: c.execute("SELECT version FROM ds.meta").fetchone())["version"] == 2
    )
    assert [x.version for x in again.host_secrets()] == [1]
    assert len(again.host_secrets()[0].key.reveal()) >= 32
