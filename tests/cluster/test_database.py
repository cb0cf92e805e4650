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


_TLS_TABLES = ("tls_requests", "tls_certificates", "tls_crl", "tls_ca")


def _as_version_2(conn: Any) -> None:
    """What the code before certificates made: a host secret table, no TLS tables."""
    for t in _TLS_TABLES:
        conn.execute(f"DROP TABLE ds.{t}")
    conn.execute(
        "CREATE TABLE ds.host_secrets (version serial PRIMARY KEY, secret text NOT NULL,"
        " created_at timestamptz NOT NULL DEFAULT now())"
    )
    conn.execute("INSERT INTO ds.host_secrets (secret) VALUES (repeat('s', 43))")
    conn.execute("UPDATE ds.meta SET version = 2")


def _tables(store: Any) -> set[str]:
    rows = store.db.run(
        lambda c: c.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'ds'"
        ).fetchall()
    )
    return {r["table_name"] for r in rows}


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_database_is_migrated_to_certificates(stores: Any, version: int) -> None:
    s = stores()
    s.db.run(_as_version_2)
    if version == 1:
        s.db.run(lambda c: c.execute("DROP TABLE ds.host_secrets"))
        s.db.run(lambda c: c.execute("ALTER TABLE ds.spaces DROP COLUMN token_lease"))
        s.db.run(lambda c: c.execute("UPDATE ds.meta SET version = 1"))
    again = stores()
    assert (
        again.db.run(lambda c: c.execute("SELECT version FROM ds.meta").fetchone())["version"] == 3
    )
    tables = _tables(again)
    assert set(_TLS_TABLES) <= tables and "host_secrets" not in tables  # a secret nobody checks
    assert again.tls_ca() is None  # until the operator's durable-spaces tls init
