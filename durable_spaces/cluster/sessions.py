"""Durable sessions, the coordinators' claims on them, and epochs: ``ClusterStore``'s
session statements.

Guarantees:

- A coordinator claims an open (pending or running) session until a claim expiry; at
  most one coordinator holds a session's claim. A claim that lapsed can be taken by
  another coordinator (``session_claimed`` records the previous holder); from then on the
  old coordinator's ``renew_session_claim``, ``begin_drive`` and ``finish_session`` raise
  ``ClaimLostError`` and append ``claim_refused``. A lapsed claim nobody took is still
  its holder's.
- ``begin_drive`` is one transaction: check the claim, acquire the session's lease (when
  it has a durable Space; pending leaves the session pending with the holder as reason,
  and issues no epoch), then issue epoch ``max(previous + 1, lease token)`` and count the
  attempt. It commits before the epoch is returned, so a driver never runs under an
  epoch that is not durable. Epochs never repeat: a retried ``begin_drive`` whose first
  commit's answer was lost burns one.
- ``raise_epoch_floor`` lifts the last issued epoch to a floor a fenced driver reported
  (never lowers it), so the next epoch goes past it.
- ``finish_session`` ends it ``done`` or ``failed`` and releases its lease in the same
  transaction; finishing again with the same outcome is a no-op.
"""

from __future__ import annotations

from typing import Any

from durable_spaces.cluster.database import Conn
from durable_spaces.cluster.leases import LEASE_SECS, LeaseStatements
from durable_spaces.cluster.records import Drive, SessionRecord, check_int, check_name, check_ttl
from durable_spaces.cluster.statements import one, record
from durable_spaces.errors import (
    ClaimLostError,
    ClusterConflictError,
    ConfigError,
    UnknownRecordError,
)

_OPEN = ("pending", "running")
_ENDS = ("done", "failed")


class SessionStatements(LeaseStatements):
    def _create_session_txn(
        self, conn: Conn, name: str, space: str | None
    ) -> SessionRecord | Exception:
        if (
            space is not None
            and not conn.execute("SELECT 1 FROM ds.spaces WHERE name = %s", (space,)).fetchone()
        ):
            return UnknownRecordError(f"no durable space {space!r}: create_space it first")
        row = conn.execute(
            "INSERT INTO ds.sessions (name, space) VALUES (%s, %s)"
            " ON CONFLICT DO NOTHING RETURNING *",
            (name, space),
        ).fetchone()
        if row is not None:
            self._event_txn(conn, "session_created", session=name, space=space)
            return record(SessionRecord, row)
        row = one(conn.execute("SELECT * FROM ds.sessions WHERE name = %s", (name,)))
        if row["space"] != space:
            return ClusterConflictError(f"session {name} exists with space {row['space']!r}")
        return record(SessionRecord, row)

    def create_session(self, name: str, space: str | None = None) -> SessionRecord:
        """A pending session, driving durable Space ``space`` (created first with
        ``create_space``) or none; idempotent for the same space."""
        check_name("session", name)
        if space is not None:
            check_name("space", space)
        return self._call(self._create_session_txn, name, space)

    def _session_txn(self, conn: Conn, name: str) -> SessionRecord | Exception:
        row = conn.execute("SELECT * FROM ds.sessions WHERE name = %s", (name,)).fetchone()
        return record(SessionRecord, row) if row else UnknownRecordError(f"no session {name!r}")

    def session(self, name: str) -> SessionRecord:
        return self._call(self._session_txn, check_name("session", name))

    def _claim_session_txn(
        self, conn: Conn, coordinator: str, ttl: float, name: str | None
    ) -> SessionRecord | None:
        # SKIP LOCKED: a session another coordinator is claiming right now is passed
        # over, not waited for. FOR UPDATE re-checks the WHERE on the row's newest version
        # (READ COMMITTED), so a claim committed meanwhile is never taken a second time.
        row = conn.execute(
            "SELECT name, claimed_by FROM ds.sessions WHERE state IN ('pending', 'running')"
            " AND (claimed_by IS NULL OR claim_expires_at <= now()"
            "      OR (%(name)s::text IS NOT NULL AND claimed_by = %(me)s))"
            " AND (%(name)s::text IS NULL OR name = %(name)s)"
            " ORDER BY created_at, name LIMIT 1 FOR UPDATE SKIP LOCKED",
            {"me": coordinator, "name": name},
        ).fetchone()
        if row is None:
            return None
        claimed = one(
            conn.execute(
                "UPDATE ds.sessions SET claimed_by = %s, updated_at = now(),"
                " claim_expires_at = now() + make_interval(secs => %s) WHERE name = %s RETURNING *",
                (coordinator, ttl, row["name"]),
            )
        )
        previous = row["claimed_by"]
        if previous != coordinator:
            self._event_txn(
                conn,
                "session_claimed",
                session=row["name"],
                coordinator=coordinator,
                previous=previous,
            )
        return record(SessionRecord, claimed)

    def claim_session(
        self, coordinator: str, ttl: float, name: str | None = None
    ) -> SessionRecord | None:
        """Claim session ``name`` (or the oldest claimable one) for ``ttl`` seconds;
        None when it is (or all are) claimed by others or finished."""
        check_name("coordinator", coordinator)
        if name is not None:
            check_name("session", name)
        return self._call(self._claim_session_txn, coordinator, check_ttl("ttl", ttl), name)

    def _claimed_txn(
        self, conn: Conn, op: str, name: str, coordinator: str, *, ended: str | None = None
    ) -> dict[str, Any] | Exception:
        """The session's row, locked, when ``coordinator`` holds its claim (or finished it
        ``ended``); else the refusal."""
        # FOR UPDATE: no takeover can slip in between this check and the transition.
        row = conn.execute("SELECT * FROM ds.sessions WHERE name = %s FOR UPDATE", (name,))
        found = row.fetchone()
        if found is None:
            return UnknownRecordError(f"no session {name!r}")
        mine = found["claimed_by"] == coordinator
        if mine and (found["state"] in _OPEN or found["state"] == ended):
            return found
        holder = found["claimed_by"]
        self._event_txn(
            conn,
            "claim_refused",
            session=name,
            op=op,
            coordinator=coordinator,
            claimed_by=holder,
            state=found["state"],
        )
        why = f"it is {found['state']}" if mine else f"it is claimed by coordinator {holder}"
        return ClaimLostError(f"session {name}: {op} by coordinator {coordinator} refused: {why}")

    def _renew_claim_txn(
        self, conn: Conn, name: str, coordinator: str, ttl: float
    ) -> SessionRecord | Exception:
        refused = self._claimed_txn(conn, "renew", name, coordinator)
        if isinstance(refused, Exception):
            return refused
        row = one(
            conn.execute(
                "UPDATE ds.sessions SET claim_expires_at = now() + make_interval(secs => %s)"
                " WHERE name = %s RETURNING *",
                (ttl, name),
            )
        )
        return record(SessionRecord, row)

    def renew_session_claim(self, name: str, coordinator: str, ttl: float) -> SessionRecord:
        args = check_name("session", name), check_name("coordinator", coordinator)
        return self._call(self._renew_claim_txn, *args, check_ttl("ttl", ttl))

    def _begin_drive_txn(
        self, conn: Conn, name: str, coordinator: str, lease_ttl: float
    ) -> Drive | Exception:
        row = self._claimed_txn(conn, "begin_drive", name, coordinator)
        if isinstance(row, Exception):
            return row
        token = 0
        if row["space"] is not None:
            got = self._acquire_lease_txn(conn, row["space"], name, lease_ttl)
            if isinstance(got, Exception):
                return got
            if not got.granted:
                return Drive(name, True, None, None, int(row["attempts"]), got.reason)
            token = got.token
        # Issued in this transaction, which commits before run() returns the epoch.
        s = one(
            conn.execute(
                "UPDATE ds.sessions SET epoch = GREATEST(epoch + 1, %s), lease_token = %s,"
                " attempts = attempts + 1, state = 'running', reason = '', updated_at = now()"
                " WHERE name = %s RETURNING epoch, attempts",
                (token, token or None, name),
            )
        )
        self._event_txn(
            conn,
            "epoch_issued",
            session=name,
            space=row["space"],
            epoch=s["epoch"],
            previous=row["epoch"],
            lease_token=token or None,
            attempt=s["attempts"],
            coordinator=coordinator,
        )
        return Drive(name, False, int(s["epoch"]), token or None, int(s["attempts"]))

    def begin_drive(self, name: str, coordinator: str, lease_ttl: float = LEASE_SECS) -> Drive:
        """Start one drive of session ``name``: its lease (if it has a Space) and a
        durable epoch ``max(previous + 1, lease token)``; or ``pending`` (see module doc)."""
        args = check_name("session", name), check_name("coordinator", coordinator)
        return self._call(self._begin_drive_txn, *args, check_ttl("lease ttl", lease_ttl))

    def _raise_epoch_floor_txn(
        self, conn: Conn, name: str, coordinator: str, floor: int
    ) -> SessionRecord | Exception:
        row = self._claimed_txn(conn, "raise_epoch_floor", name, coordinator)
        if isinstance(row, Exception):
            return row
        raised = one(
            conn.execute(
                "UPDATE ds.sessions SET epoch = GREATEST(epoch, %s), updated_at = now()"
                " WHERE name = %s RETURNING *",
                (floor, name),
            )
        )
        self._event_txn(conn, "epoch_floor", session=name, floor=floor, previous=row["epoch"])
        return record(SessionRecord, raised)

    def raise_epoch_floor(self, name: str, coordinator: str, floor: int) -> SessionRecord:
        """A driver was fenced (exit 75) by a Space whose epoch is ``floor``: the next
        drive's epoch goes past it (the file coordinator's ``_floor_seen``)."""
        args = check_name("session", name), check_name("coordinator", coordinator)
        return self._call(self._raise_epoch_floor_txn, *args, check_int("floor", floor))

    def _finish_session_txn(
        self, conn: Conn, name: str, coordinator: str, state: str, reason: str
    ) -> SessionRecord | Exception:
        row = self._claimed_txn(conn, "finish", name, coordinator, ended=state)
        if isinstance(row, Exception):
            return row
        if row["state"] == state:  # a retry of this same finish: stored once
            return record(SessionRecord, row)
        released = None
        if row["space"] is not None:
            got = conn.execute(
                "UPDATE ds.leases SET holder = NULL, acquired_at = NULL, expires_at = NULL"
                " WHERE space = %s AND holder = %s RETURNING token",
                (row["space"], name),
            ).fetchone()
            released = got["token"] if got else None
        # The claim stays on the finished session: it says who finished it.
        done = one(
            conn.execute(
                "UPDATE ds.sessions SET state = %s, reason = %s, updated_at = now()"
                " WHERE name = %s RETURNING *",
                (state, reason, name),
            )
        )
        self._event_txn(
            conn,
            "session_finished",
            session=name,
            space=row["space"],
            state=state,
            reason=reason,
            released_token=released,
            coordinator=coordinator,
        )
        return record(SessionRecord, done)

    def finish_session(
        self, name: str, coordinator: str, state: str, reason: str = ""
    ) -> SessionRecord:
        """End the session ``done`` or ``failed`` and release its lease."""
        if state not in _ENDS:
            raise ConfigError(f"session end state {state!r}: use done or failed")
        args = check_name("session", name), check_name("coordinator", coordinator)
        return self._call(self._finish_session_txn, *args, state, str(reason))

    def _sessions_txn(self, conn: Conn) -> list[SessionRecord]:
        rows = conn.execute("SELECT * FROM ds.sessions ORDER BY created_at, name")
        return [record(SessionRecord, r) for r in rows]

    def sessions(self) -> list[SessionRecord]:
        return list(self._call(self._sessions_txn))
