"""The cluster's tables in PostgreSQL (schema ``ds``), version ``VERSION``.

The store (``durable_spaces/cluster/store.py``) executes this text; nothing else does.
What the database itself guarantees, whatever a client does:

- ``ds.events`` is append-only: a trigger refuses UPDATE, DELETE and TRUNCATE.
- A lease token (``ds.leases.token``) and a session epoch (``ds.sessions.epoch``) never
  decrease; a run's record, once stored, never changes (triggers).
- A Space's access token is bound to the lease token it was minted for
  (``token_lease``).
- The cluster's certificates (``durable_spaces/cluster/certificates.py``): one CA
  certificate, never changed; one revocation list whose number never decreases; every
  certificate issued, kept (a revocation sets ``revoked_at`` once); no private key at all.
- States are closed sets (CHECK); a ``ready`` Space has a host, an address and a token,
  an ``unplaced`` one has none of them; a ``done`` run has a record; a held lease has an
  expiry.
"""

from __future__ import annotations

from typing import LiteralString

VERSION = 3

HOST_SECRETS: tuple[LiteralString, ...] = (
    """CREATE TABLE ds.host_secrets (
        version serial PRIMARY KEY,
        secret text NOT NULL CHECK (length(secret) >= 32),
        created_at timestamptz NOT NULL DEFAULT now()
    )""",
)
HOST_SECRETS_GUARD: tuple[LiteralString, ...] = (
    """CREATE TRIGGER host_secrets_kept BEFORE UPDATE OR DELETE ON ds.host_secrets
        FOR EACH ROW EXECUTE FUNCTION ds.refuse('a host secret version is never changed')""",
)
_ROLES: LiteralString = "('host', 'coordinator', 'worker')"
TLS: tuple[LiteralString, ...] = (
    """CREATE TABLE ds.tls_ca (
        id integer PRIMARY KEY CHECK (id = 1),
        cert text NOT NULL,
        fingerprint text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    )""",
    """CREATE TABLE ds.tls_crl (
        id integer PRIMARY KEY CHECK (id = 1),
        number bigint NOT NULL CHECK (number >= 1),
        crl text NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now()
    )""",
    """CREATE TABLE ds.tls_certificates (
        serial text PRIMARY KEY,
        role text NOT NULL CHECK (role IN """
    + _ROLES
    + """),
        name text NOT NULL,
        fingerprint text NOT NULL,
        not_after timestamptz NOT NULL,
        issued_at timestamptz NOT NULL DEFAULT now(),
        revoked_at timestamptz
    )""",
    """CREATE TABLE ds.tls_requests (
        id bigserial PRIMARY KEY,
        role text NOT NULL CHECK (role IN """
    + _ROLES
    + """),
        name text NOT NULL,
        csr text NOT NULL,
        key_fingerprint text NOT NULL,
        state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'issued')),
        serial text REFERENCES ds.tls_certificates (serial),
        cert text,
        created_at timestamptz NOT NULL DEFAULT now(),
        CHECK ((state = 'issued') = (cert IS NOT NULL AND serial IS NOT NULL))
    )""",
)
TLS_GUARDS: tuple[LiteralString, ...] = (
    """CREATE TRIGGER tls_ca_kept BEFORE UPDATE OR DELETE ON ds.tls_ca
        FOR EACH ROW EXECUTE FUNCTION ds.refuse('the cluster CA is never changed')""",
    """CREATE TRIGGER tls_crl_monotonic BEFORE UPDATE ON ds.tls_crl FOR EACH ROW
        WHEN (NEW.number <= OLD.number)
        EXECUTE FUNCTION ds.refuse('a revocation list is replaced only by a newer one')""",
    """CREATE TRIGGER tls_revocation_kept BEFORE UPDATE ON ds.tls_certificates FOR EACH ROW
        WHEN (OLD.revoked_at IS NOT NULL
              OR (NEW.serial, NEW.role, NEW.name, NEW.fingerprint, NEW.not_after)
                 IS DISTINCT FROM (OLD.serial, OLD.role, OLD.name, OLD.fingerprint, OLD.not_after))
        EXECUTE FUNCTION ds.refuse('an issued certificate changes only by its revocation')""",
)

#: One statement per item: each runs in the store's schema transaction.
DDL: tuple[LiteralString, ...] = (
    "CREATE SCHEMA IF NOT EXISTS ds",
    "CREATE TABLE ds.meta (version integer NOT NULL)",
    """CREATE TABLE ds.hosts (
        id text PRIMARY KEY,
        address text NOT NULL,
        backend text NOT NULL,
        state text NOT NULL DEFAULT 'up' CHECK (state IN ('up', 'lost')),
        registered_at timestamptz NOT NULL DEFAULT now(),
        heartbeat_at timestamptz NOT NULL DEFAULT now()
    )""",
    """CREATE TABLE ds.spaces (
        name text PRIMARY KEY,
        state text NOT NULL DEFAULT 'unplaced' CHECK (state IN ('unplaced', 'ready')),
        generation integer NOT NULL DEFAULT 1 CHECK (generation >= 1),
        restored_from text NOT NULL DEFAULT 'new'
            CHECK (restored_from IN ('new', 'from-scratch')),
        placement_reason text NOT NULL DEFAULT 'created',
        host_id text REFERENCES ds.hosts (id),
        address text,
        token text,
        token_lease bigint,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        CHECK ((state = 'ready') = (host_id IS NOT NULL)),
        CHECK ((host_id IS NULL) = (address IS NULL) AND (host_id IS NULL) = (token IS NULL))
    )""",
    "CREATE INDEX spaces_by_host ON ds.spaces (host_id) WHERE host_id IS NOT NULL",
    """CREATE TABLE ds.leases (
        space text PRIMARY KEY REFERENCES ds.spaces (name),
        token bigint NOT NULL DEFAULT 0 CHECK (token >= 0),
        holder text,
        acquired_at timestamptz,
        expires_at timestamptz,
        CHECK ((holder IS NULL) = (expires_at IS NULL))
    )""",
    """CREATE TABLE ds.sessions (
        name text PRIMARY KEY,
        space text REFERENCES ds.spaces (name),
        state text NOT NULL DEFAULT 'pending'
            CHECK (state IN ('pending', 'running', 'done', 'failed')),
        epoch bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
        lease_token bigint,
        attempts integer NOT NULL DEFAULT 0,
        claimed_by text,
        claim_expires_at timestamptz,
        reason text NOT NULL DEFAULT '',
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        CHECK ((claimed_by IS NULL) = (claim_expires_at IS NULL))
    )""",
    """CREATE INDEX sessions_open ON ds.sessions (created_at, name)
        WHERE state IN ('pending', 'running')""",
    """CREATE TABLE ds.events (
        id bigserial PRIMARY KEY,
        at timestamptz NOT NULL DEFAULT clock_timestamp(),
        kind text NOT NULL,
        session text,
        space text,
        host text,
        detail jsonb NOT NULL DEFAULT '{}'
    )""",
    "CREATE INDEX events_by_kind ON ds.events (kind, id)",
    """CREATE TABLE ds.runs (
        id text PRIMARY KEY,
        campaign text NOT NULL,
        spec jsonb NOT NULL,
        state text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done')),
        worker text,
        claim_expires_at timestamptz,
        attempts integer NOT NULL DEFAULT 0,
        record jsonb,
        queued_at timestamptz NOT NULL DEFAULT now(),
        started_at timestamptz,
        finished_at timestamptz,
        CHECK ((state = 'done') = (record IS NOT NULL)),
        CHECK ((state = 'running') = (claim_expires_at IS NOT NULL))
    )""",
    "CREATE INDEX runs_open ON ds.runs (campaign, queued_at, id) WHERE state <> 'done'",
    *TLS,
    # The guards: plpgsql so the message says which rule a client broke.
    """CREATE FUNCTION ds.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'ds: %', TG_ARGV[0] USING ERRCODE = 'integrity_constraint_violation';
        END $$""",
    """CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON ds.events
        FOR EACH ROW EXECUTE FUNCTION ds.refuse('events are append-only')""",
    """CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON ds.events
        FOR EACH STATEMENT EXECUTE FUNCTION ds.refuse('events are append-only')""",
    """CREATE TRIGGER lease_token_monotonic BEFORE UPDATE ON ds.leases FOR EACH ROW
        WHEN (NEW.token < OLD.token)
        EXECUTE FUNCTION ds.refuse('a lease token never decreases')""",
    """CREATE TRIGGER session_epoch_monotonic BEFORE UPDATE ON ds.sessions FOR EACH ROW
        WHEN (NEW.epoch < OLD.epoch)
        EXECUTE FUNCTION ds.refuse('a session epoch never decreases')""",
    *TLS_GUARDS,
    """CREATE TRIGGER run_record_once BEFORE UPDATE ON ds.runs FOR EACH ROW
        WHEN (OLD.record IS NOT NULL AND NEW.record IS DISTINCT FROM OLD.record)
        EXECUTE FUNCTION ds.refuse('a run record is stored once')""",
)

#: From version 1 (no host secrets, Space tokens not bound to a lease): run in the
#: store's schema transaction on a database made by older code.
MIGRATE_1_TO_2: tuple[LiteralString, ...] = (
    "ALTER TABLE ds.spaces ADD COLUMN token_lease bigint",
    *HOST_SECRETS,
    *HOST_SECRETS_GUARD,
    "UPDATE ds.meta SET version = 2",
)
#: From version 2: the host API's shared secret gives way to certificates (its HMAC was
#: replaced by mutual TLS: docs/cluster-security.md); a secret nobody checks is dropped.
MIGRATE_2_TO_3: tuple[LiteralString, ...] = (
    "DROP TABLE ds.host_secrets",
    *TLS,
    *TLS_GUARDS,
    "UPDATE ds.meta SET version = 3",
)
