"""What ``durable-spaces tls ...`` does: the cluster CA made once, a machine enrolled in one
line, a certificate rotated and revoked (kubeadm's join with a pinned CA hash, with the
files PostgreSQL's and Temporal's TLS docs describe).

1. Once, on the operator's machine: ``tls init --ca-dir DIR`` makes the CA (its key stays
   in DIR: ``pki.py`` says why), puts its certificate and first revocation list in the
   store, and prints the CA's fingerprint and the line to run on each machine.
2. On a new machine: ``tls enroll --role host --id h1 --ca sha256:... --tls-dir DIR``
   checks the store's CA against the fingerprint (then pins it in DIR), makes a key that
   never leaves the machine, stores a request and waits until it is issued. On the machine
   that holds the CA's key, ``--ca-dir`` issues at once instead.
3. The operator: ``tls approve --id h1 --ca-dir DIR`` prints the request's key fingerprint
   (the one enroll printed: compare them) and issues the certificate.
4. Rotation: ``tls renew --tls-dir DIR`` on the machine (a new key, the same identity),
   approved like an enrolment; running processes present the new certificate from their
   next refresh. The previous one stays valid until ``tls revoke --serial S``.
5. ``tls revoke`` signs a new revocation list; hosts, coordinators and drivers read it
   within seconds and refuse the certificates it names, open connections included.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography import x509

from durable_spaces.cluster import pki
from durable_spaces.cluster.certificates import check_serial
from durable_spaces.cluster.records import CertRecord
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.cluster.tls import LoadedIdentity, TlsDir, read_private, write_private
from durable_spaces.errors import ConfigError, TlsError

CA_KEY = "ca.key"
CA_CERT = "ca.pem"
MAX_DAYS = 36500
Echo = Callable[[str], None]


def _days(days: int) -> int:
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ConfigError(f"--days {days!r}: use a whole number of days in 1..{MAX_DAYS}")
    return days


def _when(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


# -- the CA --------------------------------------------------------------------------------


def load_authority(ca_dir: Path) -> pki.Authority:
    """The CA of ``ca_dir`` (its key refused when others may read it)."""
    key = pki.load_key(CA_KEY, read_private("the CA's key", ca_dir / CA_KEY))
    try:
        cert = pki.load_cert(CA_CERT, (ca_dir / CA_CERT).read_bytes())
    except OSError as e:
        raise TlsError(f"{ca_dir / CA_CERT}: {e.strerror or e}") from None
    if pki.key_fingerprint(key) != pki.key_fingerprint(cert.public_key()):
        raise TlsError(f"{ca_dir}: {CA_KEY} is not the key of {CA_CERT}")
    return pki.Authority(key, cert)


def _store_ca(store: ClusterStore) -> x509.Certificate:
    pem = store.tls_ca()
    if pem is None:
        raise TlsError(
            "the cluster has no CA yet: run durable-spaces tls init on the operator's machine"
        )
    return pki.load_cert("the store's CA", pem)


def _same_ca(store: ClusterStore, ca: pki.Authority) -> None:
    if pki.cert_fingerprint(_store_ca(store)) != ca.fingerprint:
        raise TlsError(f"the store's CA is not the one in this --ca-dir ({ca.fingerprint})")


def init(store: ClusterStore, ca_dir: Path, *, days: int = 3650) -> list[str]:
    """Make the cluster CA in ``ca_dir`` and give the store its public half (module doc).
    A ``ca_dir`` that already holds a CA is used as it is (the store must have none, or
    the same one)."""
    ca_dir = ca_dir.absolute()
    if (ca_dir / CA_KEY).exists():
        ca = load_authority(ca_dir)
    else:
        ca = pki.make_ca(_days(days))
        ca_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(ca_dir / CA_KEY, pki.key_pem(ca.key))
        write_private(ca_dir / CA_CERT, pki.cert_pem(ca.cert), 0o644)
    crl = pki.make_crl(ca, [], 1)
    store.tls_init(pki.cert_pem(ca.cert).decode(), ca.fingerprint, pki.crl_pem(crl), 1)
    return [
        f"cluster CA {ca.fingerprint} (its key: {ca_dir / CA_KEY}; keep it off the cluster)",
        "enrol each machine with: durable-spaces tls enroll --role host|coordinator|worker"
        f" --id ID --ca {ca.fingerprint} --tls-dir DIR",
        f"then approve it here: durable-spaces tls approve --ca-dir {ca_dir} --id ID",
    ]


# -- issuing -------------------------------------------------------------------------------


def issue_for(
    store: ClusterStore,
    ca: pki.Authority,
    who: pki.Identity,
    public_key: pki.PublicKeyTypes,
    *,
    days: int = 365,
    request: int | None = None,
    not_before: dt.datetime | None = None,
) -> x509.Certificate:
    """A certificate for ``who``, recorded in the store (answering ``request``)."""
    _same_ca(store, ca)
    cert = pki.issue(ca, public_key, who, days=_days(days), not_before=not_before)
    store.record_certificate(
        pki.serial_text(cert.serial_number),
        who,
        pki.cert_fingerprint(cert),
        cert.not_valid_after_utc,
        request=request,
        cert=pki.cert_pem(cert).decode() if request is not None else None,
    )
    return cert


def enrol_here(
    store: ClusterStore,
    ca: pki.Authority,
    tls_dir: Path,
    who: pki.Identity,
    *,
    days: int = 365,
    not_before: dt.datetime | None = None,
) -> LoadedIdentity:
    """Enrol ``who`` in ``tls_dir`` on the machine that holds the CA's key (one step: the
    lab's hosts and coordinators, an operator's own machine)."""
    d = TlsDir(tls_dir)
    key = pki.new_key()
    cert = issue_for(store, ca, who, key.public_key(), days=days, not_before=not_before)
    d.write_ca(ca.cert)
    d.write_identity(key, cert)
    return d.identity(ca.cert)


def _pin(store: ClusterStore, d: TlsDir, pin: str | None, ca_dir: Path | None) -> x509.Certificate:
    """The store's CA, accepted only as the one the operator named (module doc)."""
    ca = _store_ca(store)
    got = pki.cert_fingerprint(ca)
    if ca_dir is not None:
        want = load_authority(ca_dir).fingerprint
    elif pin is not None:
        want = pin.strip().lower()
    elif (d.path / "ca.pem").exists():
        want = pki.cert_fingerprint(d.ca())
    else:
        raise ConfigError(
            "give --ca sha256:... (printed by durable-spaces tls init), so this machine"
            " trusts the cluster's CA and no other"
        )
    if got != want:
        raise TlsError(f"the store's CA is {got}, not {want}: this machine trusts neither")
    if (d.path / "ca.pem").exists() and pki.cert_fingerprint(d.ca()) != got:
        raise TlsError(f"{d.path} already trusts another CA: use another --tls-dir")
    return ca


def _installed(d: TlsDir, key: pki.PrivateKey, cert_text: str, ca: x509.Certificate) -> str:
    cert = pki.load_cert("the issued certificate", cert_text)
    if pki.key_fingerprint(cert.public_key()) != pki.key_fingerprint(key):
        raise TlsError("the issued certificate is not for this machine's key")
    if not pki.issued_by(cert, ca):
        raise TlsError("the issued certificate is not the pinned CA's")
    d.write_ca(ca)
    d.write_identity(key, cert)
    d.clear_pending()
    return _enrolled(d, d.identity(ca))


def _enrolled(d: TlsDir, own: LoadedIdentity) -> str:
    return (
        f"enrolled {own.who}: certificate {pki.serial_text(own.serial)},"
        f" valid until {_when(own.cert.not_valid_after_utc)}, in {d.path / 'identity.pem'}"
    )


def enroll(
    store: ClusterStore,
    tls_dir: Path,
    who: pki.Identity,
    *,
    pin: str | None = None,
    ca_dir: Path | None = None,
    days: int = 365,
    wait_secs: float = 900.0,
    poll_secs: float = 1.0,
    echo: Echo = print,
) -> str:
    """Enrol this machine as ``who`` (module doc); the line saying what was installed."""
    d = TlsDir(tls_dir)
    ca_cert = _pin(store, d, pin, ca_dir)
    if ca_dir is not None:
        return _enrolled(d, enrol_here(store, load_authority(ca_dir), d.path, who, days=days))
    pending = d.pending()
    request = None
    if pending is not None and (pending[0].get("role"), pending[0].get("id")) == (who.role, who.id):
        meta, key = pending
        request = meta.get("request")
        if not isinstance(request, int):
            request = None
    if request is None:
        key = pki.new_key()
        csr = pki.make_request(key, who)
        request = store.request_certificate(who, pki.request_pem(csr), pki.key_fingerprint(key))
        d.write_pending({"request": request, "role": who.role, "id": who.id}, key)
    echo(
        f"request {request} for {who}: key {pki.key_fingerprint(key)}; waiting for the"
        f" operator: durable-spaces tls approve --ca-dir CA_DIR --id {who.id} --role {who.role}"
    )
    end = time.monotonic() + wait_secs
    while True:
        r = store.certificate_request(request)
        if r.state == "issued" and r.cert is not None:
            return _installed(d, key, r.cert, ca_cert)
        if time.monotonic() >= end:
            raise TlsError(
                f"request {request} for {who} is not approved yet: run this command again"
                " to keep waiting (the request and its key are kept)"
            )
        time.sleep(poll_secs)


def renew(
    store: ClusterStore,
    tls_dir: Path,
    *,
    ca_dir: Path | None = None,
    days: int = 365,
    wait_secs: float = 900.0,
    echo: Echo = print,
) -> str:
    """A new key and certificate for the identity ``tls_dir`` holds (rotation)."""
    d = TlsDir(tls_dir)
    who = d.identity().who
    return enroll(store, d.path, who, ca_dir=ca_dir, days=days, wait_secs=wait_secs, echo=echo)


def approve(
    store: ClusterStore,
    ca_dir: Path,
    *,
    who_id: str | None = None,
    role: str | None = None,
    request: int | None = None,
    every: bool = False,
    days: int = 365,
) -> list[str]:
    """Issue the pending requests chosen (one line each, with the key's fingerprint to
    compare with enroll's, and the identity's older certificates still valid)."""
    if who_id is None and request is None and not every:
        raise ConfigError("say which request: --id ID [--role ROLE], --request N or --all")
    ca = load_authority(ca_dir)
    chosen = store.certificate_requests("pending", request=request, role=role, name=who_id)
    if not chosen:
        raise TlsError("no pending certificate request matches")
    out = []
    for r in chosen:
        csr = pki.load_request(r.csr)
        who = pki.named(csr)
        public = csr.public_key()
        if (who.role, who.id, pki.key_fingerprint(public)) != (r.role, r.name, r.key_fingerprint):
            raise TlsError(f"request {r.id} does not match what it was stored as: not issued")
        older = [c for c in store.certificates(who.role, who.id) if _valid(c)]
        cert = issue_for(store, ca, who, public, days=days, request=r.id)
        out.append(
            f"issued {who}: certificate {pki.serial_text(cert.serial_number)}, key"
            f" {r.key_fingerprint}, valid until {_when(cert.not_valid_after_utc)}"
        )
        out += [
            f"  {who} still holds certificate {c.serial}: once the new one is in use,"
            f" durable-spaces tls revoke --ca-dir {ca_dir} --serial {c.serial}"
            for c in older
        ]
    return out


def _valid(c: CertRecord) -> bool:
    return c.revoked_at is None and c.not_after > dt.datetime.now(dt.UTC)


def revoke(
    store: ClusterStore,
    ca_dir: Path,
    *,
    serials: Sequence[str] = (),
    who_id: str | None = None,
    role: str | None = None,
) -> list[str]:
    """Revoke ``serials`` and/or every valid certificate of ``who_id`` (``role``), in a
    new revocation list the CA signs; one line each."""
    if not serials and who_id is None:
        raise ConfigError("say what to revoke: --serial S (repeatable) or --id ID [--role ROLE]")
    ca = load_authority(ca_dir)
    _same_ca(store, ca)
    known = {c.serial: c for c in store.certificates()}
    chosen = [check_serial(s.lower()) for s in serials]
    for s in chosen:
        if s not in known:
            raise TlsError(f"no certificate {s} was issued by this cluster's CA")
    if who_id is not None:
        chosen += [c.serial for c in store.certificates(role, who_id) if c.revoked_at is None]
    new = sorted({s for s in chosen if known.get(s) is None or known[s].revoked_at is None})
    if not new:
        raise TlsError("nothing to revoke: every certificate named is revoked already")
    now = dt.datetime.now(dt.UTC)
    revoked = [(int(c.serial, 16), c.revoked_at) for c in known.values() if c.revoked_at]
    revoked += [(int(s, 16), now) for s in new]
    number = (store.tls_crl_number() or 0) + 1
    crl = pki.make_crl(ca, revoked, number)
    done = store.revoke_certificates(new, now, pki.crl_pem(crl), number)
    return [
        f"revoked {known[s].role} {known[s].name}: certificate {s} (revocation list {number})"
        for s in done
    ]


def listing(store: ClusterStore) -> list[str]:
    """Every certificate and waiting request, one line each."""
    ca = store.tls_ca()
    if ca is None:
        return ["no cluster CA (durable-spaces tls init)"]
    out = [
        f"CA {pki.cert_fingerprint(pki.load_cert('the CA', ca))},"
        f" revocation list {store.tls_crl_number()}"
    ]
    now = dt.datetime.now(dt.UTC)
    for c in store.certificates():
        state = "revoked" if c.revoked_at else ("expired" if c.not_after <= now else "valid")
        out.append(f"{c.serial} {c.role} {c.name} until {_when(c.not_after)} {state}")
    for r in store.certificate_requests("pending"):
        out.append(f"request {r.id} {r.role} {r.name} key {r.key_fingerprint} waiting")
    return out


__all__ = [
    "approve",
    "enrol_here",
    "enroll",
    "init",
    "listing",
    "load_authority",
    "renew",
    "revoke",
]
