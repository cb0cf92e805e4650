"""Hosts and where each durable Space runs: ``ClusterStore``'s placement statements.

Guarantees:

- A host registers and heartbeats; ``mark_lost_hosts(bound)`` declares lost every host
  whose last heartbeat is older than ``bound`` (database time, so the machines' clocks do
  not matter; and never within ``bound`` of the database server's own start, since no
  host could heartbeat while it was down) and, in the same transaction, marks all its
  Spaces for placement again: generation + 1, ``restored_from = from-scratch``, the
  reason, no address or token. A lost host's heartbeat raises ``HostLostError`` until it
  registers again.
- Exactly one placement per generation: ``place_space`` for a generation that is not the
  one waiting (a racing placer, or a stale one) raises ``ClusterConflictError``; onto a
  lost host, ``HostLostError``.
- A Space's token is written only by ``place_space`` and ``set_space_token`` (a host's
  rotation for a new lease) and read only by ``connect``
  (``durable_spaces/cluster/leases.py``); ``SpaceRecord``s never carry it. Each token is
  bound to the lease token current when it was minted (``token_lease``).
- A Space is unplaced only on evidence the store can check: its host's own report
  (``space_lost``, which names the host: a report about another host's placement changes
  nothing) or the host's heartbeat lapsing (``mark_lost_hosts``). What a host answers a
  coordinator never unplaces anything by itself (``placer.py``).
"""

from __future__ import annotations

from durable_spaces.backends import known_backends
from durable_spaces.cluster.database import Conn
from durable_spaces.cluster.records import (
    HostRecord,
    Secret,
    SpaceRecord,
    check_int,
    check_name,
    check_printable,
    check_ttl,
)
from durable_spaces.cluster.statements import Statements, one, record
from durable_spaces.errors import (
    ClusterConflictError,
    ConfigError,
    HostLostError,
    UnknownRecordError,
)

SPACE_COLUMNS = "name, state, generation, restored_from, placement_reason, host_id, address"


class PlacementStatements(Statements):
    # -- hosts ---------------------------------------------------------------------------

    def _register_host_txn(
        self, conn: Conn, host_id: str, address: str, backend: str
    ) -> HostRecord:
        row = one(
            conn.execute(
                "INSERT INTO ds.hosts (id, address, backend) VALUES (%s, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET address = EXCLUDED.address,"
                " backend = EXCLUDED.backend, state = 'up', heartbeat_at = now() RETURNING *",
                (host_id, address, backend),
            )
        )
        self._event_txn(conn, "host_registered", host=host_id, address=address, backend=backend)
        return record(HostRecord, row)

    def register_host(self, host_id: str, address: str, backend: str) -> HostRecord:
        """Register (or, after it was lost, re-register) a host that provides Spaces of
        ``backend``, a name from ``durable_spaces.backends``."""
        check_name("host id", host_id)
        check_printable("host address", address)
        if backend not in known_backends():
            raise ConfigError(f"backend {backend!r}: known are {', '.join(known_backends())}")
        return self._call(self._register_host_txn, host_id, address, backend)

    def _heartbeat_host_txn(self, conn: Conn, host_id: str) -> HostRecord | Exception:
        row = conn.execute(
            "UPDATE ds.hosts SET heartbeat_at = now() WHERE id = %s AND state = 'up' RETURNING *",
            (host_id,),
        ).fetchone()
        if row is not None:
            return record(HostRecord, row)
        if conn.execute("SELECT 1 FROM ds.hosts WHERE id = %s", (host_id,)).fetchone() is None:
            return UnknownRecordError(f"no host {host_id!r}")
        return HostLostError(f"host {host_id} was declared lost: drop its Spaces, register again")

    def heartbeat_host(self, host_id: str) -> HostRecord:
        return self._call(self._heartbeat_host_txn, check_name("host id", host_id))

    def _mark_lost_hosts_txn(self, conn: Conn, bound_secs: float) -> list[str]:
        lost = conn.execute(
            # Silence is counted from the server's start at the earliest: while the
            # database was down no host could heartbeat, and none is lost for that.
            "UPDATE ds.hosts SET state = 'lost' WHERE state = 'up'"
            " AND GREATEST(heartbeat_at, pg_postmaster_start_time())"
            " < now() - make_interval(secs => %s) RETURNING id, heartbeat_at",
            (bound_secs,),
        ).fetchall()
        for h in lost:
            self._event_txn(
                conn,
                "host_lost",
                host=h["id"],
                bound_secs=bound_secs,
                heartbeat_at=h["heartbeat_at"].isoformat(),
            )
            self._unplace_txn(conn, f"host {h['id']} lost", host=h["id"])
        return [h["id"] for h in lost]

    def mark_lost_hosts(self, bound_secs: float) -> list[str]:
        """Declare lost every host silent for more than ``bound_secs``; their Spaces wait
        for placement again. Returns the ids declared lost.

        SERIALIZABLE: it decides on a predicate (stale heartbeats, then every Space of
        those hosts) while ``place_space`` reads a host's state and writes a Space; under
        READ COMMITTED such a placement racing the sweep could leave a ready Space on a lost
        host. Serializable snapshot isolation aborts one of the two (retried by Database).
        """
        check_ttl("lost-host bound", bound_secs)
        return list(self._call(self._mark_lost_hosts_txn, bound_secs, serializable=True))

    def _hosts_txn(self, conn: Conn) -> list[HostRecord]:
        return [record(HostRecord, r) for r in conn.execute("SELECT * FROM ds.hosts ORDER BY id")]

    def hosts(self) -> list[HostRecord]:
        return list(self._call(self._hosts_txn))

    # -- durable Spaces ------------------------------------------------------------------

    def _create_space_txn(self, conn: Conn, name: str) -> SpaceRecord | Exception:
        new = conn.execute(
            "INSERT INTO ds.spaces (name) VALUES (%s) ON CONFLICT DO NOTHING RETURNING name",
            (name,),
        ).fetchone()
        if new is not None:
            conn.execute("INSERT INTO ds.leases (space) VALUES (%s)", (name,))
            self._event_txn(conn, "space_created", space=name)
        return self._space_txn(conn, name)

    def create_space(self, name: str) -> SpaceRecord:
        """A durable Space waiting for its first placement (generation 1); idempotent."""
        return self._call(self._create_space_txn, check_name("space", name))

    def _space_txn(self, conn: Conn, name: str) -> SpaceRecord | Exception:
        found = conn.execute(
            f"SELECT {SPACE_COLUMNS} FROM ds.spaces WHERE name = %s", (name,)
        ).fetchone()
        return (
            record(SpaceRecord, found)
            if found
            else UnknownRecordError(f"no durable space {name!r}")
        )

    def space(self, name: str) -> SpaceRecord:
        return self._call(self._space_txn, check_name("space", name))

    def _spaces_txn(self, conn: Conn, state: str | None) -> list[SpaceRecord]:
        rows = conn.execute(
            f"SELECT {SPACE_COLUMNS} FROM ds.spaces"
            " WHERE %(s)s::text IS NULL OR state = %(s)s ORDER BY name",
            {"s": state},
        )
        return [record(SpaceRecord, r) for r in rows]

    def spaces(self, state: str | None = None) -> list[SpaceRecord]:
        """Every durable Space; ``state="unplaced"``: those waiting for placement."""
        return list(self._call(self._spaces_txn, state))

    def _place_space_txn(
        self, conn: Conn, name: str, generation: int, host_id: str, address: str, token: str
    ) -> SpaceRecord | Exception:
        host = conn.execute("SELECT state FROM ds.hosts WHERE id = %s", (host_id,)).fetchone()
        if host is None:
            return UnknownRecordError(f"no host {host_id!r}")
        if host["state"] != "up":
            return HostLostError(f"host {host_id} is lost: place space {name} elsewhere")
        # FOR UPDATE: two placers of one generation queue here; the second sees it ready.
        sp = conn.execute(
            "SELECT state, generation FROM ds.spaces WHERE name = %s FOR UPDATE", (name,)
        ).fetchone()
        if sp is None:
            return UnknownRecordError(f"no durable space {name!r}")
        if sp["state"] != "unplaced" or sp["generation"] != generation:
            return ClusterConflictError(
                f"space {name}: generation {generation} is not waiting for placement"
                f" (generation {sp['generation']} is {sp['state']})"
            )
        row = one(
            conn.execute(
                # A token nobody has seen yet: it belongs to the current lease.
                "UPDATE ds.spaces SET state = 'ready', host_id = %s, address = %s, token = %s,"
                " token_lease = (SELECT token FROM ds.leases WHERE space = %s),"
                f" updated_at = now() WHERE name = %s RETURNING {SPACE_COLUMNS}",
                (host_id, address, token, name, name),
            )
        )
        self._event_txn(
            conn,
            "space_placed",
            space=name,
            host=host_id,
            generation=generation,
            restored_from=row["restored_from"],
            address=address,
        )
        return record(SpaceRecord, row)

    def place_space(
        self, name: str, generation: int, host_id: str, address: str, token: str | Secret
    ) -> SpaceRecord:
        """``generation`` of Space ``name`` now runs on ``host_id`` at ``address`` with
        access ``token``. A second placement of one generation raises
        ``ClusterConflictError`` (its placer should remove its copy). SERIALIZABLE: see
        ``mark_lost_hosts``."""
        secret = token.reveal() if isinstance(token, Secret) else token
        check_printable("space token", secret)
        args = (
            check_name("space", name),
            check_int("generation", generation),
            check_name("host id", host_id),
            check_printable("space address", address),
            secret,
        )
        return self._call(self._place_space_txn, *args, serializable=True)

    def _unplace_txn(
        self,
        conn: Conn,
        reason: str,
        *,
        host: str,
        name: str | None = None,
        generation: int | None = None,
    ) -> list[str]:
        """Ready Spaces on ``host`` (or, when ``name`` is given, its generation
        ``generation`` if ``host`` holds it) wait for placement again, from scratch."""
        # One fixed predicate each, so the planner uses the key or the host's index: the
        # lost-host sweep is SERIALIZABLE, and a scan of the whole table would take a
        # predicate lock on it that every placement then conflicts with.
        which = (
            " WHERE state = 'ready' AND host_id = %(host)s"
            if name is None
            else " WHERE name = %(name)s AND state = 'ready' AND generation = %(gen)s"
            " AND host_id = %(host)s"
        )
        rows = conn.execute(
            "UPDATE ds.spaces SET state = 'unplaced', generation = generation + 1,"
            " restored_from = 'from-scratch', placement_reason = %(reason)s, host_id = NULL,"
            " address = NULL, token = NULL, token_lease = NULL, updated_at = now()"
            + which
            + " RETURNING name, generation",
            {"reason": reason, "host": host, "name": name, "gen": generation},
        ).fetchall()
        for r in rows:
            self._event_txn(
                conn,
                "space_unplaced",
                space=r["name"],
                host=host,
                generation=r["generation"],
                reason=reason,
            )
        return [r["name"] for r in rows]

    def space_lost(self, name: str, generation: int, reason: str, *, host: str) -> SpaceRecord:
        """Host ``host`` reports ``generation`` of ``name`` gone (its sandbox was removed,
        or it does not have it): it waits for placement again from scratch. A no-op for
        any other generation, and for a generation placed on another host."""
        check_name("space", name)
        check_name("host id", host)
        gen = check_int("generation", generation)
        self._call(self._unplace_txn, reason, host=host, name=name, generation=gen)
        return self.space(name)
