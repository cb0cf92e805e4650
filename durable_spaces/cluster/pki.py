"""The cluster's certificates, made with ``cryptography``: one CA, a certificate per host,
coordinator and worker, and the CA's list of the ones it revoked.

Decisions (docs/cluster-security.md gives the reasons at length):

- **The CA's private key stays with the operator** (``ca.key`` in a directory of theirs,
  mode 0600, refused when anyone else may read it, as PostgreSQL refuses its server key).
  The store holds only public things: the CA's certificate, the certificates it issued,
  the requests waiting for one, and the signed revocation list. Every machine of the
  cluster holds the database URL, so a key in the store, even encrypted with a passphrase
  that must then sit beside every enrolment, would let a leaked URL or a database dump
  mint any identity; kept apart, the database can at most refuse service (a revocation
  list it withholds fails every handshake closed) and never speaks for a machine.
- **Names**: an identity is a role (``host``, ``coordinator``, ``worker``) and an id,
  written ``<id>.<role>.ds-cluster.internal`` (``.internal`` is reserved for private use)
  as the certificate's only DNS name and its common name. An id is one lowercase DNS label,
  so a name cannot be read two ways. A client checks the host it meant with standard
  hostname verification (it asks for ``h1.host...`` whatever address it dials); a host
  reads its peer's role from the name.
- **Purposes**: a host's certificate is for ``serverAuth`` only, a coordinator's and a
  worker's for ``clientAuth`` only, so OpenSSL itself refuses a host's certificate offered
  by a client and a coordinator's offered by a server.
- ECDSA P-256 with SHA-256; serials random (159 bits); a certificate starts five minutes
  in the past (clocks that disagree a little). The revocation list's next update is the
  CA's own end: nobody can sign a fresher one without the key, so it must not go stale.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from durable_spaces.errors import ConfigError, TlsError

ROLES = ("host", "coordinator", "worker")
SUFFIX = "ds-cluster.internal"
#: The roles a host serves (module doc: a host never serves another host).
CLIENT_ROLES = ("coordinator", "worker")
_ID = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_SKEW = dt.timedelta(minutes=5)
PrivateKey = ec.EllipticCurvePrivateKey
PublicKey = ec.EllipticCurvePublicKey


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Identity:
    """Who a certificate speaks for: ``role`` and ``id`` (module doc)."""

    role: str
    id: str

    @property
    def dns(self) -> str:
        return f"{self.id}.{self.role}.{SUFFIX}"

    def __str__(self) -> str:
        return f"{self.role} {self.id}"


def identity(role: str, id_: str) -> Identity:
    """``Identity(role, id_)`` checked: ``ConfigError`` naming what a name cannot be."""
    if role not in ROLES:
        raise ConfigError(f"role {role!r}: use one of {', '.join(ROLES)}")
    if not isinstance(id_, str) or not _ID.match(id_):
        raise ConfigError(
            f"{role} id {id_!r} cannot name a certificate: use lowercase letters, digits and"
            " '-' (one DNS label, at most 63)"
        )
    return Identity(role, id_)


def parse_dns(name: str) -> Identity | None:
    """The identity a DNS name of this cluster's form stands for; None for anything else."""
    head, _, suffix = name.partition(".")
    role, _, rest = suffix.partition(".")
    if rest != SUFFIX or role not in ROLES or not _ID.match(head):
        return None
    return Identity(role, head)


def fingerprint(der: bytes) -> str:
    return "sha256:" + hashlib.sha256(der).hexdigest()


def cert_fingerprint(cert: x509.Certificate) -> str:
    return fingerprint(cert.public_bytes(serialization.Encoding.DER))


def key_fingerprint(key: PublicKeyTypes | PrivateKey) -> str:
    """Of the public half of ``key`` (a request's, a certificate's or a private key's)."""
    public = key.public_key() if isinstance(key, PrivateKey) else key
    der = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return fingerprint(der)


def serial_text(serial: int) -> str:
    return format(serial, "x")


# -- keys and PEM ------------------------------------------------------------------------


def new_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def load_key(what: str, pem: bytes) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise TlsError(f"{what} is not an unencrypted PEM private key: {e}") from None
    if not isinstance(key, PrivateKey):
        raise TlsError(f"{what} is not an elliptic-curve key")
    return key


def load_cert(what: str, pem: bytes | str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem.encode() if isinstance(pem, str) else pem)
    except ValueError as e:
        raise TlsError(f"{what} is not a PEM certificate: {e}") from None


def load_certs(what: str, pem: bytes) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as e:
        raise TlsError(f"{what} holds no PEM certificate: {e}") from None
    return certs


# -- the CA ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Authority:
    """The cluster CA: its key (the operator's) and its certificate (everyone's)."""

    key: PrivateKey
    cert: x509.Certificate

    @property
    def fingerprint(self) -> str:
        return cert_fingerprint(self.cert)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA signs certificates and revocation lists; a machine's key signs handshakes."""
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(days: int = 3650, *, label: str = "durable-spaces cluster CA") -> Authority:
    key = new_key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(label))
        .issuer_name(_name(label))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(key, cert)


def is_ca_cert(cert: x509.Certificate) -> bool:
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    return bool(bc.ca)


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether ``ca``'s key signed ``cert`` (and names it the issuer)."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# -- requests and certificates -----------------------------------------------------------


def make_request(key: PrivateKey, who: Identity) -> x509.CertificateSigningRequest:
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(_name(who.dns))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(who.dns)]), critical=False)
        .sign(key, hashes.SHA256())
    )


def request_pem(csr: x509.CertificateSigningRequest) -> str:
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def load_request(pem: str) -> x509.CertificateSigningRequest:
    """A request as stored, refused unless its own key signed it (a request whose key the
    requester does not hold would make a certificate nobody can use, or someone else's)."""
    try:
        csr = x509.load_pem_x509_csr(pem.encode())
    except ValueError as e:
        raise TlsError(f"a certificate request is not PEM: {e}") from None
    if not csr.is_signature_valid:
        raise TlsError("a certificate request is not signed by its own key")
    if not isinstance(csr.public_key(), PublicKey):
        raise TlsError("a certificate request's key is not an elliptic-curve key")
    return csr


def _dns_names(ext_owner: x509.Certificate | x509.CertificateSigningRequest) -> list[str]:
    try:
        san = ext_owner.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.DNSName))


def named(owner: x509.Certificate | x509.CertificateSigningRequest) -> Identity:
    """The one identity a certificate or request names; ``TlsError`` otherwise."""
    names = _dns_names(owner)
    who = parse_dns(names[0]) if len(names) == 1 else None
    if who is None:
        raise TlsError(f"names {names!r} are not one identity of this cluster")
    return who


def issue(
    ca: Authority,
    public_key: PublicKeyTypes,
    who: Identity,
    *,
    days: int = 365,
    not_before: dt.datetime | None = None,
) -> x509.Certificate:
    """A certificate for ``who`` (module doc: its name and purpose by role), valid for
    ``days`` from ``not_before`` (default now, less five minutes of skew); never past the
    CA's own end."""
    start = (not_before or _now()) - _SKEW
    end = min(start + _SKEW + dt.timedelta(days=days), ca.cert.not_valid_after_utc)
    if not isinstance(public_key, PublicKey):
        raise TlsError("a certificate is issued for an elliptic-curve key only")
    purpose = (
        ExtendedKeyUsageOID.SERVER_AUTH if who.role == "host" else ExtendedKeyUsageOID.CLIENT_AUTH
    )
    return (
        x509.CertificateBuilder()
        .subject_name(_name(who.dns))
        .issuer_name(ca.cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(who.dns)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(ca.key, hashes.SHA256())
    )


# -- revocation --------------------------------------------------------------------------


def make_crl(
    ca: Authority, revoked: Iterable[tuple[int, dt.datetime]], number: int
) -> x509.CertificateRevocationList:
    """The CA's revocation list number ``number``, naming ``revoked`` (serial, when)."""
    now = _now()
    b = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.cert.subject)
        .last_update(now - _SKEW)
        .next_update(ca.cert.not_valid_after_utc)
        .add_extension(x509.CRLNumber(number), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    for serial, when in revoked:
        b = b.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build()
        )
    return b.sign(ca.key, hashes.SHA256())


def crl_pem(crl: x509.CertificateRevocationList) -> str:
    return crl.public_bytes(serialization.Encoding.PEM).decode()


@dataclass(frozen=True)
class RevocationList:
    """A revocation list checked against the CA: its number and the serials it names."""

    number: int
    pem: str
    serials: frozenset[int]


def check_crl(pem: str, ca: x509.Certificate) -> RevocationList:
    """``pem`` as a revocation list ``ca`` signed (``TlsError`` otherwise: a list anyone
    else wrote, a database's forgery, is never taken)."""
    try:
        crl = x509.load_pem_x509_crl(pem.encode())
    except ValueError as e:
        raise TlsError(f"the revocation list is not PEM: {e}") from None
    public = ca.public_key()
    if crl.issuer != ca.subject or not isinstance(public, PublicKey):
        raise TlsError("the revocation list is not the cluster CA's")
    if not crl.is_signature_valid(public):
        raise TlsError("the revocation list's signature is not the cluster CA's")
    try:
        number = int(crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number)
    except x509.ExtensionNotFound:
        raise TlsError("the revocation list has no number") from None
    return RevocationList(number, pem, frozenset(r.serial_number for r in crl))


__all__ = [
    "CLIENT_ROLES",
    "ROLES",
    "Authority",
    "Identity",
    "RevocationList",
    "check_crl",
    "identity",
    "issue",
    "make_ca",
    "make_crl",
    "make_request",
    "named",
    "parse_dns",
]
