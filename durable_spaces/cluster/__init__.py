"""The cluster's shared state, for durable sessions beyond one machine.

``ClusterStore`` (``store.py``) keeps hosts, durable Spaces, leases, sessions, an
append-only event log and the campaign run queue in PostgreSQL, with exact lease-token
and epoch semantics; ``PgServer`` (``pgserver.py``) runs a private PostgreSQL for tests,
CI and a one-machine lab. Import them from their modules (``psycopg`` is needed only
by the store).
"""
