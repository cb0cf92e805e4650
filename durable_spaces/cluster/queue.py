"""The run queue for campaigns spread over machines: ``ClusterStore``'s run statements.

Guarantees:

- ``enqueue_run`` is idempotent: the same id with the same campaign and spec is one run;
  with another, ``ClusterConflictError``.
- ``dequeue_run`` hands each run to one worker at a time (``FOR UPDATE SKIP LOCKED``,
  oldest first) with a claim expiry. A worker that dies gives its run back when the
  claim lapses: the next ``dequeue_run`` takes it over (``attempts`` + 1, the previous
  worker in the ``run_claimed`` event). A lapsed claim nobody took is still its worker's.
- ``finish_run`` stores the record exactly once, by the worker holding the claim. The
  same worker finishing again with the same record (a retry whose first answer was
  lost) is a no-op; anyone else, or another record, is refused with ``ClaimLostError``
  (``run_claim_refused``). A trigger (``durable_spaces/cluster/schema.py``) keeps a stored
  record from ever changing.
"""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from durable_spaces.cluster.database import Conn
from durable_spaces.cluster.records import Run, check_json, check_name, check_ttl
from durable_spaces.cluster.statements import Statements, one, record
from durable_spaces.errors import (
    ClaimLostError,
    ClusterConflictError,
    UnknownRecordError,
)


class RunQueueStatements(Statements):
    def _enqueue_run_txn(
        self, conn: Conn, run_id: str, campaign: str, spec: dict[str, Any]
    ) -> Run | Exception:
        row = conn.execute(
            "INSERT INTO ds.runs (id, campaign, spec) VALUES (%s, %s, %s)"
            " ON CONFLICT DO NOTHING RETURNING *",
            (run_id, campaign, Jsonb(spec)),
        ).fetchone()
        if row is not None:
            self._event_txn(conn, "run_queued", run=run_id, campaign=campaign)
            return record(Run, row)
        row = one(conn.execute("SELECT * FROM ds.runs WHERE id = %s", (run_id,)))
        if row["campaign"] != campaign or row["spec"] != spec:
            return ClusterConflictError(f"run {run_id} is already queued with another spec")
        return record(Run, row)

    def enqueue_run(self, run_id: str, campaign: str, spec: dict[str, Any]) -> Run:
        args = check_name("run id", run_id), check_name("campaign", campaign)
        return self._call(self._enqueue_run_txn, *args, check_json("run spec", spec))

    def _dequeue_run_txn(
        self, conn: Conn, worker: str, ttl: float, campaign: str | None
    ) -> Run | None:
        # SKIP LOCKED: workers dequeue in parallel without waiting on each other's pick.
        # FOR UPDATE re-checks the WHERE on the newest version (READ COMMITTED), so a run
        # claimed meanwhile is not handed out twice.
        row = conn.execute(
            "SELECT id, worker, state FROM ds.runs"
            " WHERE (state = 'queued' OR (state = 'running' AND claim_expires_at <= now()))"
            " AND (%(c)s::text IS NULL OR campaign = %(c)s)"
            " ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED",
            {"c": campaign},
        ).fetchone()
        if row is None:
            return None
        claimed = one(
            conn.execute(
                "UPDATE ds.runs SET state = 'running', worker = %s, attempts = attempts + 1,"
                " claim_expires_at = now() + make_interval(secs => %s), started_at = now()"
                " WHERE id = %s RETURNING *",
                (worker, ttl, row["id"]),
            )
        )
        self._event_txn(
            conn,
            "run_claimed",
            run=row["id"],
            worker=worker,
            attempt=claimed["attempts"],
            previous=row["worker"] if row["state"] == "running" else None,
        )
        return record(Run, claimed)

    def dequeue_run(self, worker: str, ttl: float, campaign: str | None = None) -> Run | None:
        """The oldest queued run (or one whose worker's claim lapsed), claimed by
        ``worker`` for ``ttl`` seconds; None when there is none."""
        check_name("worker", worker)
        if campaign is not None:
            check_name("campaign", campaign)
        return self._call(self._dequeue_run_txn, worker, check_ttl("ttl", ttl), campaign)

    def _claimed_run_txn(
        self, conn: Conn, op: str, run_id: str, worker: str
    ) -> dict[str, Any] | Exception:
        # FOR UPDATE: no takeover can slip in between this check and the transition.
        row = conn.execute("SELECT * FROM ds.runs WHERE id = %s FOR UPDATE", (run_id,))
        found = row.fetchone()
        if found is None:
            return UnknownRecordError(f"no run {run_id!r}")
        if found["state"] == "running" and found["worker"] == worker:
            return found
        self._event_txn(
            conn,
            "run_claim_refused",
            run=run_id,
            op=op,
            worker=worker,
            holder=found["worker"],
            state=found["state"],
        )
        why = "it is done" if found["state"] == "done" else f"its worker is {found['worker']}"
        return ClaimLostError(f"run {run_id}: {op} by worker {worker} refused: {why}")

    def _renew_run_txn(self, conn: Conn, run_id: str, worker: str, ttl: float) -> Run | Exception:
        refused = self._claimed_run_txn(conn, "renew", run_id, worker)
        if isinstance(refused, Exception):
            return refused
        row = one(
            conn.execute(
                "UPDATE ds.runs SET claim_expires_at = now() + make_interval(secs => %s)"
                " WHERE id = %s RETURNING *",
                (ttl, run_id),
            )
        )
        return record(Run, row)

    def renew_run(self, run_id: str, worker: str, ttl: float) -> Run:
        args = check_name("run id", run_id), check_name("worker", worker)
        return self._call(self._renew_run_txn, *args, check_ttl("ttl", ttl))

    def _finish_run_txn(
        self, conn: Conn, run_id: str, worker: str, result: dict[str, Any]
    ) -> Run | Exception:
        row = conn.execute("SELECT * FROM ds.runs WHERE id = %s FOR UPDATE", (run_id,))
        found = row.fetchone()
        if found is not None and (found["state"], found["worker"], found["record"]) == (
            "done",
            worker,
            result,
        ):  # a retry of this same finish: the record is stored once
            return record(Run, found)
        refused = self._claimed_run_txn(conn, "finish", run_id, worker)
        if isinstance(refused, Exception):
            return refused
        done = one(
            conn.execute(
                "UPDATE ds.runs SET state = 'done', record = %s, claim_expires_at = NULL,"
                " finished_at = now() WHERE id = %s RETURNING *",
                (Jsonb(result), run_id),
            )
        )
        self._event_txn(conn, "run_finished", run=run_id, worker=worker, attempt=done["attempts"])
        return record(Run, done)

    def finish_run(self, run_id: str, worker: str, result: dict[str, Any]) -> Run:
        """Store the run's record (once) and mark it done."""
        args = check_name("run id", run_id), check_name("worker", worker)
        return self._call(self._finish_run_txn, *args, check_json("run record", result))

    def _run_txn(self, conn: Conn, run_id: str) -> Run | Exception:
        row = conn.execute("SELECT * FROM ds.runs WHERE id = %s", (run_id,)).fetchone()
        return record(Run, row) if row else UnknownRecordError(f"no run {run_id!r}")

    def run(self, run_id: str) -> Run:
        return self._call(self._run_txn, check_name("run id", run_id))

    def _runs_txn(self, conn: Conn, campaign: str | None) -> list[Run]:
        rows = conn.execute(
            "SELECT * FROM ds.runs WHERE %(c)s::text IS NULL OR campaign = %(c)s"
            " ORDER BY queued_at, id",
            {"c": campaign},
        )
        return [record(Run, r) for r in rows]

    def runs(self, campaign: str | None = None) -> list[Run]:
        return list(self._call(self._runs_txn, campaign))
