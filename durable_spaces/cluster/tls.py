"""A machine's cluster identity on disk, and the TLS contexts made of it and of the CA's
revocation list (certificates: ``pki.py``).

A TLS directory (``--tls-dir``) holds:

- ``ca.pem``: the cluster CA this machine trusts, pinned at enrolment (its fingerprint
  was given on the command line, or the CA's key was at hand). Never replaced from the
  store afterwards: a database that swaps the CA it shows changes no machine's trust.
- ``identity.pem``: this machine's key and certificate in one file, mode 0600, replaced
  whole by a rotation, so a process never pairs a key of one with a certificate of
  another.
- while an enrolment waits for the operator: ``request.key`` and ``request.json``.

``Trust`` is what one process presents and accepts, as PostgreSQL's ``verify-full`` and
Temporal's mutual TLS would have it:

- TLS 1.3 only; a certificate required of both sides; the CA of ``ca.pem`` the only
  anchor; every peer's certificate checked against the CA's revocation list
  (``VERIFY_CRL_CHECK_LEAF``: with no list there is no handshake, closed rather than open);
  a client checks the server's name (the host it meant: ``HostClient``).
- The revocation list comes from the store, and is taken only when the CA signed it and
  its number is not below the one held: a database that rolls it back un-revokes nothing.
- ``refresh`` reads the list again and notices a rotated ``identity.pem``; ``version``
  changes with either, and each context is made once per version.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509

from durable_spaces.cluster import pki
from durable_spaces.errors import TlsError
from durable_spaces.host.bounded import MAX_STATE_BYTES, load_json
from durable_spaces.host.files import fsync_dir

CA_FILE = "ca.pem"
IDENTITY_FILE = "identity.pem"
REQUEST_KEY = "request.key"
REQUEST_FILE = "request.json"


class CrlSource(Protocol):
    """Where the revocation list is read (``ClusterStore.tls_crl``)."""

    def tls_crl(self) -> str | None: ...


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``data`` in ``path``, replaced whole and durably, created with ``mode``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_private(what: str, path: Path) -> bytes:
    """A file holding a private key: refused when group or others may read it."""
    try:
        st = path.stat()
        data = path.read_bytes()
    except OSError as e:
        raise TlsError(f"{what} {path}: {e.strerror or e}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TlsError(f"{what} {path} may be read by group or others: chmod 600 it")
    return data


@dataclass(frozen=True)
class LoadedIdentity:
    who: pki.Identity
    cert: x509.Certificate
    pem: bytes  # key and certificate, as ``load_cert_chain`` reads them

    @property
    def serial(self) -> int:
        return int(self.cert.serial_number)


class TlsDir:
    """The files of one machine's identity (module doc)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).absolute()

    def __repr__(self) -> str:
        return f"TlsDir({str(self.path)!r})"

    def make(self) -> None:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)

    def ca(self) -> x509.Certificate:
        try:
            pem = (self.path / CA_FILE).read_bytes()
        except OSError as e:
            raise TlsError(
                f"{self.path / CA_FILE}: {e.strerror or e} (enrol this machine first:"
                " durable-spaces tls enroll)"
            ) from None
        certs = pki.load_certs(f"{self.path / CA_FILE}", pem)
        if len(certs) != 1 or not pki.is_ca_cert(certs[0]):
            raise TlsError(f"{self.path / CA_FILE} must hold exactly one CA certificate")
        return certs[0]

    def write_ca(self, cert: x509.Certificate) -> None:
        self.make()
        write_private(self.path / CA_FILE, pki.cert_pem(cert), 0o644)

    def identity(self, ca: x509.Certificate | None = None) -> LoadedIdentity:
        """This machine's key and certificate, checked: the key is the certificate's, the
        pinned CA issued it, it names one identity of the cluster."""
        path = self.path / IDENTITY_FILE
        if not path.exists():
            raise TlsError(
                f"no identity in {self.path} (enrol this machine: durable-spaces tls enroll)"
            )
        pem = read_private("identity", path)
        key = pki.load_key(f"{path}", pem)
        cert = pki.load_cert(f"{path}", pem)
        if pki.key_fingerprint(cert.public_key()) != pki.key_fingerprint(key):
            raise TlsError(f"{path}: the key is not the certificate's")
        if not pki.issued_by(cert, ca or self.ca()):
            raise TlsError(f"{path}: the certificate is not issued by the CA of {CA_FILE}")
        return LoadedIdentity(pki.named(cert), cert, pem)

    def write_identity(self, key: pki.PrivateKey, cert: x509.Certificate) -> None:
        self.make()
        write_private(self.path / IDENTITY_FILE, pki.key_pem(key) + pki.cert_pem(cert))

    def identity_stamp(self) -> tuple[int, int, int]:
        """What changes when ``identity.pem`` is replaced (inode, mtime, size)."""
        try:
            st = (self.path / IDENTITY_FILE).stat()
        except OSError:
            return (0, 0, 0)
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    # -- an enrolment waiting for the operator --------------------------------------------

    def pending(self) -> tuple[dict[str, Any], pki.PrivateKey] | None:
        try:
            meta = load_json(self.path / REQUEST_FILE, max_bytes=MAX_STATE_BYTES)
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict):
            return None
        key = pki.load_key("request key", read_private("request key", self.path / REQUEST_KEY))
        return meta, key

    def write_pending(self, meta: dict[str, Any], key: pki.PrivateKey) -> None:
        self.make()
        write_private(self.path / REQUEST_KEY, pki.key_pem(key))
        write_private(self.path / REQUEST_FILE, json.dumps(meta).encode(), 0o644)

    def clear_pending(self) -> None:
        for name in (REQUEST_FILE, REQUEST_KEY):
            (self.path / name).unlink(missing_ok=True)


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path that reads ``data``, in memory (``memfd_create``), gone when left."""
    fd = os.memfd_create("ds-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def peer_identity(cert: dict[str, Any] | None) -> pki.Identity | None:
    """The identity a verified peer's certificate (``getpeercert()``) names, or None."""
    if not cert:
        return None
    names = [v for k, v in cert.get("subjectAltName", ()) if k == "DNS"]
    return pki.parse_dns(names[0]) if len(names) == 1 else None


def peer_serial(cert: dict[str, Any] | None) -> int | None:
    raw = (cert or {}).get("serialNumber")
    try:
        return int(raw, 16) if isinstance(raw, str) else None
    except ValueError:
        return None


class Trust:
    """What one process presents and accepts (module doc). ``expect``: the identity its
    certificate must name (a host started as h1 presents host h1, nothing else)."""

    def __init__(self, tls_dir: str | os.PathLike[str], expect: pki.Identity | None = None) -> None:
        self.dir = TlsDir(tls_dir)
        self.expect = expect
        self._ca = self.dir.ca()
        self._lock = threading.Lock()
        self._crl: pki.RevocationList | None = None
        self._read_at = 0.0
        self._stamp = (0, 0, 0)
        self._own = self._load_identity()
        self._contexts: dict[tuple[str, tuple[Any, ...]], ssl.SSLContext] = {}

    def __repr__(self) -> str:
        return f"Trust({self.identity}, crl={self.crl_number})"

    def _load_identity(self) -> LoadedIdentity:
        stamp = self.dir.identity_stamp()
        own = self.dir.identity(self._ca)
        if self.expect is not None and own.who != self.expect:
            raise TlsError(
                f"the certificate in {self.dir.path} is for {own.who}, not {self.expect}"
            )
        self._stamp = stamp
        return own

    @property
    def identity(self) -> pki.Identity:
        return self._own.who

    @property
    def serial(self) -> int:
        return self._own.serial

    @property
    def ca(self) -> x509.Certificate:
        return self._ca

    @property
    def crl_number(self) -> int | None:
        return None if self._crl is None else self._crl.number

    @property
    def version(self) -> tuple[Any, ...]:
        return (self._stamp, self.crl_number)

    def revoked(self, serial: int | None) -> bool:
        return serial is not None and self._crl is not None and serial in self._crl.serials

    def set_crl(self, pem: str) -> bool:
        """Take ``pem`` when the CA signed it and it is not older; True when taken."""
        crl = pki.check_crl(pem, self._ca)
        with self._lock:
            if self._crl is not None and crl.number <= self._crl.number:
                return False
            self._crl = crl
            self._contexts.clear()
            return True

    def refresh(self, source: CrlSource, *, every: float = 0.0) -> bool:
        """Read the revocation list from ``source`` (at most once per ``every`` seconds)
        and notice a rotated identity; True when the version changed. A list the store
        cannot give now keeps the one held; a rotated identity that does not load keeps
        the one in use (``TlsError`` only when there is neither list nor identity)."""
        now = time.monotonic()
        if every and self._crl is not None and now - self._read_at < every:
            return False
        before = self.version
        self._read_at = now
        pem = source.tls_crl()
        if pem is None and self._crl is None:
            raise TlsError("the store has no revocation list: run durable-spaces tls init")
        if pem is not None:
            self.set_crl(pem)
        if self.dir.identity_stamp() != self._stamp:
            try:
                own = self._load_identity()
            except TlsError:
                pass  # half-written by hand, or wrong: keep presenting the one in use
            else:
                with self._lock:
                    self._own = own
                    self._contexts.clear()
        return self.version != before

    def _context(self, side: str) -> ssl.SSLContext:
        with self._lock:
            key = (side, self.version)
            ctx = self._contexts.get(key)
            if ctx is not None:
                return ctx
            if self._crl is None:
                raise TlsError("no revocation list read yet: Trust.refresh first")
            server = side == "server"
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF | ssl.VERIFY_X509_STRICT
            # load_cert_chain and a CRL take only files: files in memory, this process's
            # alone (a temporary directory was slower on a driver's way to its first step,
            # docs/performance.md, and put a copy of the key on a disk)
            with _memory_file(self._own.pem) as own:
                ctx.load_cert_chain(own)
            with _memory_file(pki.cert_pem(self._ca) + self._crl.pem.encode()) as anchors:
                ctx.load_verify_locations(cafile=anchors)
            # Contexts of an older version are dropped: a client made with one keeps it.
            kept = {k: v for k, v in self._contexts.items() if k[1] == key[1]}
            self._contexts = {**kept, key: ctx}
            return ctx

    def server_context(self) -> ssl.SSLContext:
        return self._context("server")

    def client_context(self) -> ssl.SSLContext:
        return self._context("client")


__all__ = ["CrlSource", "LoadedIdentity", "TlsDir", "Trust", "peer_identity", "peer_serial"]
