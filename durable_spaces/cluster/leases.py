"""A durable Space's lease: ``ClusterStore``'s lease statements.

Guarantees:

- One holder session at a time. Acquiring while another session holds the lease
  unexpired is *pending* with ``held by session:<holder>``, written on the acquiring
  session (if it is a stored session) and as a ``lease_pending`` event.
- Every acquisition, by any session and also by the holder again (each drive acquires),
  gets the previous token + 1, durably; a token is never handed out twice and never
  decreases (a trigger in ``durable_spaces/cluster/schema.py`` backs this).
- A token stays valid until it is superseded by a newer acquisition or released; expiry
  only lets another session acquire. ``renew_lease``, ``connect`` and ``release_lease``
  with any other token raise ``LeaseLostError`` and append a ``lease_refused`` event
  (op, token, current) that survives the error.
- ``connect`` is the only way to read a Space's access token, and it gives it only to
  the current token's holder, and only a Space token minted for that lease (placed
  during it, or rotated for it: ``set_space_token``); otherwise the Space is unavailable
  until its host rotated it (``hostapi.py``'s ``/v1/rotate``, which the coordinator asks
  before every drive). So a superseded holder never learns the token in use.
- ``grant`` says what the store gave the current lease: the epoch issued with it, the
  highest a daemon's floor may hold while it is current.
"""

from __future__ import annotations

from typing import Any

from durable_spaces.cluster.database import Conn
from durable_spaces.cluster.records import (
    Acquisition,
    Grant,
    Lease,
    Secret,
    SpaceConnection,
    check_int,
    check_name,
    check_printable,
    check_ttl,
)
from durable_spaces.cluster.statements import Statements, one, record
from durable_spaces.errors import (
    ClusterConflictError,
    LeaseLostError,
    SpaceUnavailableError,
    UnknownRecordError,
)

LEASE_SECS = 7 * 24 * 3600.0  # the reference's lease runs for seven days


def _lease_args(space: str, session: str, token: int) -> tuple[str, str, int]:
    return check_name("space", space), check_name("session", session), check_int("token", token)


class LeaseStatements(Statements):
    def _acquire_lease_txn(
        self, conn: Conn, space: str, session: str, ttl: float
    ) -> Acquisition | Exception:
        # The session's row first (the store's lock order, see store.py), so writing the
        # pending reason below cannot deadlock with begin_drive.
        conn.execute("SELECT 1 FROM ds.sessions WHERE name = %s FOR UPDATE", (session,))
        # FOR UPDATE: acquirers of one Space queue on its lease row; after the wait READ
        # COMMITTED re-reads the row's newest version, so exactly one finds it free.
        row = conn.execute(
            "SELECT token, holder, expires_at > now() AS live FROM ds.leases"
            " WHERE space = %s FOR UPDATE",
            (space,),
        ).fetchone()
        if row is None:
            return UnknownRecordError(f"no durable space {space!r}")
        holder, token = row["holder"], int(row["token"])
        if holder is not None and holder != session and row["live"]:
            reason = f"held by session:{holder}"
            conn.execute(
                "UPDATE ds.sessions SET state = 'pending', reason = %s, updated_at = now()"
                " WHERE name = %s AND state IN ('pending', 'running')",
                (reason, session),
            )
            self._event_txn(
                conn, "lease_pending", space=space, session=session, holder=holder, token=token
            )
            return Acquisition(space, session, False, token, holder, reason)
        conn.execute(
            "UPDATE ds.leases SET token = %s, holder = %s, acquired_at = now(),"
            " expires_at = now() + make_interval(secs => %s) WHERE space = %s",
            (token + 1, session, ttl, space),
        )
        self._event_txn(
            conn,
            "lease_acquired",
            space=space,
            session=session,
            token=token + 1,
            previous_holder=holder,
        )
        return Acquisition(space, session, True, token + 1, session)

    def acquire_lease(self, space: str, session: str, ttl: float = LEASE_SECS) -> Acquisition:
        """Take ``space``'s lease for ``session`` (token = previous + 1), or learn that
        it is pending because another session holds it."""
        args = check_name("space", space), check_name("session", session), check_ttl("ttl", ttl)
        return self._call(self._acquire_lease_txn, *args)

    def _check_lease_txn(
        self, conn: Conn, op: str, space: str, session: str, token: int
    ) -> dict[str, Any] | Exception:
        """The lease row when ``token`` is current and ``session``'s; else the refusal."""
        # FOR UPDATE: no acquisition can supersede the token between this check and the
        # caller's use of it later in the same transaction.
        row = conn.execute(
            "SELECT token, holder FROM ds.leases WHERE space = %s FOR UPDATE", (space,)
        ).fetchone()
        if row is None:
            return UnknownRecordError(f"no durable space {space!r}")
        current, holder = int(row["token"]), row["holder"]
        if token == current and holder == session:
            return row
        if token > current:
            why = f"never issued (the current token is {current})"
        elif token < current:
            why = f"superseded by token {current}"
        else:
            why = "released" if holder is None else f"held by session:{holder}"
        self._event_txn(
            conn,
            "lease_refused",
            space=space,
            session=session,
            op=op,
            token=token,
            current=current,
            holder=holder,
        )
        return LeaseLostError(space, session, token, current, why)

    def _renew_lease_txn(
        self, conn: Conn, space: str, session: str, token: int, ttl: float
    ) -> Lease | Exception:
        refused = self._check_lease_txn(conn, "renew", space, session, token)
        if isinstance(refused, Exception):
            return refused
        row = one(
            conn.execute(
                "UPDATE ds.leases SET expires_at = now() + make_interval(secs => %s)"
                " WHERE space = %s RETURNING space, token, holder, expires_at",
                (ttl, space),
            )
        )
        return record(Lease, row)

    def renew_lease(self, space: str, session: str, token: int, ttl: float = LEASE_SECS) -> Lease:
        args = _lease_args(space, session, token)
        return self._call(self._renew_lease_txn, *args, check_ttl("ttl", ttl))

    def _connect_txn(
        self, conn: Conn, space: str, session: str, token: int
    ) -> SpaceConnection | Exception:
        refused = self._check_lease_txn(conn, "connect", space, session, token)
        if isinstance(refused, Exception):
            return refused
        sp = one(
            conn.execute(
                "SELECT state, generation, restored_from, host_id, address, token, token_lease"
                " FROM ds.spaces WHERE name = %s",
                (space,),
            )
        )
        if sp["state"] != "ready":
            return SpaceUnavailableError(
                f"space {space} generation {sp['generation']} is waiting for placement"
            )
        if sp["token_lease"] != token:
            return SpaceUnavailableError(
                f"space {space}: its access token was minted for lease {sp['token_lease']},"
                f" not {token}: its host rotates it before the drive"
            )
        return SpaceConnection(
            space,
            sp["generation"],
            sp["restored_from"],
            sp["host_id"],
            sp["address"],
            token,
            Secret(sp["token"]),
        )

    def connect(self, space: str, session: str, token: int) -> SpaceConnection:
        """Where ``space`` runs and its access token, for the drive holding lease
        ``token`` (``SpaceUnavailableError`` while it waits for placement)."""
        args = _lease_args(space, session, token)
        return self._call(self._connect_txn, *args)

    def _release_lease_txn(
        self, conn: Conn, space: str, session: str, token: int
    ) -> Lease | Exception:
        refused = self._check_lease_txn(conn, "release", space, session, token)
        if isinstance(refused, Exception):
            return refused
        row = one(
            conn.execute(
                "UPDATE ds.leases SET holder = NULL, acquired_at = NULL, expires_at = NULL"
                " WHERE space = %s RETURNING space, token, holder, expires_at",
                (space,),
            )
        )
        self._event_txn(conn, "lease_released", space=space, session=session, token=token)
        return record(Lease, row)

    def release_lease(self, space: str, session: str, token: int) -> Lease:
        args = _lease_args(space, session, token)
        return self._call(self._release_lease_txn, *args)

    def _lease_txn(self, conn: Conn, space: str) -> Lease | Exception:
        row = conn.execute(
            "SELECT space, token, holder, expires_at FROM ds.leases WHERE space = %s", (space,)
        ).fetchone()
        return record(Lease, row) if row else UnknownRecordError(f"no durable space {space!r}")

    def lease(self, space: str) -> Lease:
        return self._call(self._lease_txn, check_name("space", space))

    def _grant_txn(self, conn: Conn, space: str, lease: int) -> Grant | Exception:
        row = conn.execute(
            "SELECT l.token, l.holder, s.epoch, s.lease_token, sp.token_lease"
            " FROM ds.leases l JOIN ds.spaces sp ON sp.name = l.space"
            " LEFT JOIN ds.sessions s ON s.name = l.holder WHERE l.space = %s",
            (space,),
        ).fetchone()
        if row is None:
            return UnknownRecordError(f"no durable space {space!r}")
        if row["token"] != lease or row["holder"] is None:
            return ClusterConflictError(
                f"space {space}: lease {lease} is not the current one (token {row['token']},"
                f" holder {row['holder']})"
            )
        epoch = int(row["epoch"]) if row["lease_token"] == lease else None
        return Grant(space, lease, row["holder"], epoch, row["token_lease"] == lease)

    def grant(self, space: str, lease: int) -> Grant:
        """What the store gave lease ``lease`` of ``space`` (``ClusterConflictError`` when
        it is not the current one): its holder, the epoch issued with it (None when the
        holder is not a stored session's drive), and whether the Space's token is already
        that lease's."""
        return self._call(self._grant_txn, check_name("space", space), check_int("lease", lease))

    def _set_space_token_txn(
        self, conn: Conn, space: str, generation: int, host_id: str, lease: int, token: str
    ) -> Exception | None:
        # The lease row first (the store's lock order): no acquisition slips in between.
        row = conn.execute(
            "SELECT token, holder FROM ds.leases WHERE space = %s FOR UPDATE", (space,)
        ).fetchone()
        if row is None:
            return UnknownRecordError(f"no durable space {space!r}")
        if row["token"] != lease or row["holder"] is None:
            return ClusterConflictError(f"space {space}: lease {lease} is not the current one")
        done = conn.execute(
            "UPDATE ds.spaces SET token = %s, token_lease = %s, updated_at = now()"
            " WHERE name = %s AND state = 'ready' AND generation = %s AND host_id = %s"
            " RETURNING name",
            (token, lease, space, generation, host_id),
        ).fetchone()
        if done is None:
            return ClusterConflictError(
                f"space {space}: generation {generation} is not ready on host {host_id}"
            )
        self._event_txn(
            conn,
            "space_token_rotated",
            space=space,
            host=host_id,
            generation=generation,
            lease=lease,
        )
        return None

    def set_space_token(
        self, space: str, generation: int, host_id: str, lease: int, token: str | Secret
    ) -> None:
        """The Space's daemon now takes ``token`` (its host rotated it for ``lease``, the
        current lease); ``connect`` hands it to that lease's holder only."""
        secret = token.reveal() if isinstance(token, Secret) else token
        check_printable("space token", secret)
        args = (
            check_name("space", space),
            check_int("generation", generation),
            check_name("host id", host_id),
            check_int("lease", lease),
            secret,
        )
        self._call(self._set_space_token_txn, *args)
