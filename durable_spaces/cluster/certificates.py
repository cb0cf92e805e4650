"""The cluster's public key material: ``ClusterStore``'s certificate statements.

What the store keeps (``pki.py`` says why no private key is among it):

- the CA's certificate, once (``tls_init``; a second CA is refused, the same one is a
  no-op), and its revocation list, replaced only by a higher number (a trigger);
- every certificate issued (serial, identity, fingerprint, end), and its revocation;
- the requests machines made for a certificate (``tls enroll``), until the operator
  issues them (``tls approve``).

Nothing read here is trusted for its own sake: a machine pins the CA at enrolment (a
fingerprint given on its command line), checks every certificate it is given against it,
and takes a revocation list only when that CA signed it (``tls.py``). The store is where
they meet.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence

from durable_spaces.cluster import pki
from durable_spaces.cluster.database import Conn
from durable_spaces.cluster.records import CertRecord, CertRequest, check_int
from durable_spaces.cluster.statements import Statements, record
from durable_spaces.errors import ClusterConflictError, ConfigError, UnknownRecordError

_SERIAL = re.compile(r"^[0-9a-f]{1,40}$")
_FINGERPRINT = re.compile(r"^sha256:[0-9a-f]{64}$")
_PEM_MAX = 16 * 1024


def check_serial(value: object) -> str:
    if not isinstance(value, str) or not _SERIAL.match(value):
        raise ConfigError(f"serial {value!r}: use the certificate's serial in lowercase hex")
    return value


def _check_pem(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.startswith("-----BEGIN ") or len(value) > _PEM_MAX:
        raise ConfigError(f"{what} must be PEM text of at most {_PEM_MAX} bytes")
    return value


def _check_fingerprint(value: object) -> str:
    if not isinstance(value, str) or not _FINGERPRINT.match(value):
        raise ConfigError(f"fingerprint {value!r}: use sha256:<64 hex digits>")
    return value


class CertificateStatements(Statements):
    # -- the CA and its revocation list ---------------------------------------------------

    def _tls_init_txn(
        self, conn: Conn, cert: str, fingerprint: str, crl: str, number: int
    ) -> str | Exception:
        conn.execute("LOCK TABLE ds.tls_ca IN EXCLUSIVE MODE")
        row = conn.execute("SELECT fingerprint FROM ds.tls_ca").fetchone()
        if row is not None:
            if row["fingerprint"] != fingerprint:
                return ClusterConflictError(
                    f"the cluster already has a CA ({row['fingerprint']}): its key is with"
                    " whoever ran durable-spaces tls init"
                )
            return str(row["fingerprint"])
        conn.execute(
            "INSERT INTO ds.tls_ca (id, cert, fingerprint) VALUES (1, %s, %s)", (cert, fingerprint)
        )
        conn.execute("INSERT INTO ds.tls_crl (id, number, crl) VALUES (1, %s, %s)", (number, crl))
        self._event_txn(conn, "tls_ca_created", fingerprint=fingerprint)
        return fingerprint

    def tls_init(self, cert: str, fingerprint: str, crl: str, number: int = 1) -> str:
        """Make ``cert`` the cluster's CA with its first revocation list; idempotent for
        the same CA, ``ClusterConflictError`` for another."""
        args = (
            _check_pem("CA certificate", cert),
            _check_fingerprint(fingerprint),
            _check_pem("revocation list", crl),
            check_int("revocation list number", number),
        )
        return str(self._call(self._tls_init_txn, *args))

    def _tls_ca_txn(self, conn: Conn) -> str | None:
        row = conn.execute("SELECT cert FROM ds.tls_ca").fetchone()
        return None if row is None else str(row["cert"])

    def tls_ca(self) -> str | None:
        """The CA's certificate (PEM), or None before ``tls init``."""
        out = self._call(self._tls_ca_txn)
        return None if out is None else str(out)

    def _tls_crl_txn(self, conn: Conn) -> tuple[int, str] | None:
        row = conn.execute("SELECT number, crl FROM ds.tls_crl").fetchone()
        return None if row is None else (int(row["number"]), str(row["crl"]))

    def tls_crl(self) -> str | None:
        """The CA's current revocation list (PEM), or None before ``tls init``."""
        out = self._call(self._tls_crl_txn)
        return None if out is None else str(out[1])

    def tls_crl_number(self) -> int | None:
        out = self._call(self._tls_crl_txn)
        return None if out is None else int(out[0])

    # -- requests --------------------------------------------------------------------------

    def _request_txn(self, conn: Conn, role: str, name: str, csr: str, key_fp: str) -> int:
        row = conn.execute(
            "INSERT INTO ds.tls_requests (role, name, csr, key_fingerprint)"
            " VALUES (%s, %s, %s, %s) RETURNING id",
            (role, name, csr, key_fp),
        ).fetchone()
        assert row is not None
        self._event_txn(conn, "tls_requested", request=row["id"], role=role, name=name)
        return int(row["id"])

    def request_certificate(self, who: pki.Identity, csr: str, key_fingerprint: str) -> int:
        """Store a machine's request for a certificate naming ``who``; its id."""
        who = pki.identity(who.role, who.id)
        args = (_check_pem("certificate request", csr), _check_fingerprint(key_fingerprint))
        return int(self._call(self._request_txn, who.role, who.id, *args))

    def _requests_txn(
        self, conn: Conn, state: str | None, request: int | None, role: str | None, name: str | None
    ) -> list[CertRequest]:
        rows = conn.execute(
            "SELECT * FROM ds.tls_requests WHERE (%(s)s::text IS NULL OR state = %(s)s)"
            " AND (%(i)s::bigint IS NULL OR id = %(i)s)"
            " AND (%(r)s::text IS NULL OR role = %(r)s)"
            " AND (%(n)s::text IS NULL OR name = %(n)s) ORDER BY id",
            {"s": state, "i": request, "r": role, "n": name},
        )
        return [record(CertRequest, r) for r in rows]

    def certificate_requests(
        self,
        state: str | None = "pending",
        *,
        request: int | None = None,
        role: str | None = None,
        name: str | None = None,
    ) -> list[CertRequest]:
        if request is not None:
            check_int("request", request)
        return list(self._call(self._requests_txn, state, request, role, name))

    def certificate_request(self, request: int) -> CertRequest:
        found = self.certificate_requests(None, request=request)
        if not found:
            raise UnknownRecordError(f"no certificate request {request}")
        return found[0]

    # -- certificates ----------------------------------------------------------------------

    def _record_txn(
        self,
        conn: Conn,
        serial: str,
        who: pki.Identity,
        fingerprint: str,
        not_after: dt.datetime,
        request: int | None,
        cert: str | None,
    ) -> CertRecord | Exception:
        if request is not None:
            row = conn.execute(
                "SELECT state, role, name FROM ds.tls_requests WHERE id = %s FOR UPDATE",
                (request,),
            ).fetchone()
            if row is None:
                return UnknownRecordError(f"no certificate request {request}")
            if row["state"] != "pending" or (row["role"], row["name"]) != (who.role, who.id):
                return ClusterConflictError(
                    f"certificate request {request} is {row['state']}, for {row['role']}"
                    f" {row['name']}: not issued again"
                )
        out = conn.execute(
            "INSERT INTO ds.tls_certificates (serial, role, name, fingerprint, not_after)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING *",
            (serial, who.role, who.id, fingerprint, not_after),
        ).fetchone()
        if request is not None:
            conn.execute(
                "UPDATE ds.tls_requests SET state = 'issued', serial = %s, cert = %s WHERE id = %s",
                (serial, cert, request),
            )
        self._event_txn(
            conn, "tls_issued", serial=serial, role=who.role, name=who.id, request=request
        )
        assert out is not None
        return record(CertRecord, out)

    def record_certificate(
        self,
        serial: str,
        who: pki.Identity,
        fingerprint: str,
        not_after: dt.datetime,
        *,
        request: int | None = None,
        cert: str | None = None,
    ) -> CertRecord:
        """A certificate the CA issued (for ``request``, which it answers with ``cert``)."""
        who = pki.identity(who.role, who.id)
        if request is not None:
            check_int("request", request)
            _check_pem("certificate", cert)
        args = (check_serial(serial), who, _check_fingerprint(fingerprint), not_after)
        out: CertRecord = self._call(self._record_txn, *args, request, cert)
        return out

    def _certificates_txn(self, conn: Conn, role: str | None, name: str | None) -> list[CertRecord]:
        rows = conn.execute(
            "SELECT * FROM ds.tls_certificates WHERE (%(r)s::text IS NULL OR role = %(r)s)"
            " AND (%(n)s::text IS NULL OR name = %(n)s) ORDER BY issued_at, serial",
            {"r": role, "n": name},
        )
        return [record(CertRecord, r) for r in rows]

    def certificates(self, role: str | None = None, name: str | None = None) -> list[CertRecord]:
        return list(self._call(self._certificates_txn, role, name))

    def _revoke_txn(
        self, conn: Conn, serials: Sequence[str], when: dt.datetime, crl: str, number: int
    ) -> list[str] | Exception:
        row = conn.execute("SELECT number FROM ds.tls_crl FOR UPDATE").fetchone()
        if row is None:
            return UnknownRecordError("the cluster has no CA: run durable-spaces tls init")
        if int(row["number"]) != number - 1:
            return ClusterConflictError(
                f"the revocation list is number {row['number']} now, not {number - 1}:"
                " another revocation came first; run this one again"
            )
        done = conn.execute(
            "UPDATE ds.tls_certificates SET revoked_at = %s"
            " WHERE serial = ANY(%s) AND revoked_at IS NULL RETURNING serial, role, name",
            (when, list(serials)),
        ).fetchall()
        conn.execute(
            "UPDATE ds.tls_crl SET number = %s, crl = %s, updated_at = now()", (number, crl)
        )
        for r in done:
            self._event_txn(
                conn, "tls_revoked", serial=r["serial"], role=r["role"], name=r["name"], crl=number
            )
        return [str(r["serial"]) for r in done]

    def revoke_certificates(
        self, serials: Sequence[str], when: dt.datetime, crl: str, number: int
    ) -> list[str]:
        """Mark ``serials`` revoked at ``when`` and install revocation list ``number``
        (which names them), in one transaction; ``ClusterConflictError`` when the list
        is no longer ``number - 1``. Returns the serials newly revoked."""
        args = (
            [check_serial(s) for s in serials],
            when,
            _check_pem("revocation list", crl),
            check_int("revocation list number", number),
        )
        return list(self._call(self._revoke_txn, *args))


__all__ = ["CertificateStatements", "check_serial"]
