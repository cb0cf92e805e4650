"""The cluster's certificates and a machine's TLS directory on their own
(durable_spaces/cluster/pki.py, tls.py): names that cannot be read two ways, a purpose per
role, revocation lists taken only from the CA and only forward, an identity refused when
it is not the one expected or its key is readable by others. No database, no network."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from durable_spaces.cluster import pki
from durable_spaces.cluster.tls import TlsDir, Trust
from durable_spaces.errors import ConfigError, TlsError


@pytest.mark.parametrize("bad", ["H1", "h_1", "h.1", "-h1", "h1-", "", "a" * 64, "h1 "])
def test_an_id_that_could_be_read_two_ways_names_no_certificate(bad: str) -> None:
    with pytest.raises(ConfigError, match="cannot name a certificate"):
        pki.identity("host", bad)


def test_a_name_reads_back_as_the_identity_it_was_made_of() -> None:
    who = pki.identity("coordinator", "c-1")
    assert who.dns == "c-1.coordinator.ds-cluster.internal"
    assert pki.parse_dns(who.dns) == who
    for other in (
        "c-1.admin.ds-cluster.internal",
        "c-1.coordinator.example.com",
        "a.b.h1.host.ds-cluster.internal",
    ):
        assert pki.parse_dns(other) is None
    with pytest.raises(ConfigError, match="role 'admin'"):
        pki.identity("admin", "a")


@pytest.mark.parametrize(
    ("role", "purpose"),
    [
        ("host", ExtendedKeyUsageOID.SERVER_AUTH),
        ("coordinator", ExtendedKeyUsageOID.CLIENT_AUTH),
        ("worker", ExtendedKeyUsageOID.CLIENT_AUTH),
    ],
)
def test_each_role_has_one_purpose(role: str, purpose: x509.ObjectIdentifier) -> None:
    ca = pki.make_ca()
    cert = pki.issue(ca, pki.new_key().public_key(), pki.identity(role, "x1"))
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [purpose]
    assert pki.named(cert) == pki.identity(role, "x1")
    assert pki.issued_by(cert, ca.cert) and not pki.issued_by(cert, pki.make_ca().cert)


def test_a_certificate_never_outlives_its_ca() -> None:
    ca = pki.make_ca(days=10)
    cert = pki.issue(ca, pki.new_key().public_key(), pki.identity("host", "h1"), days=365)
    assert cert.not_valid_after_utc == ca.cert.not_valid_after_utc


def test_a_request_is_taken_only_when_its_own_key_signed_it() -> None:
    key = pki.new_key()
    csr = pki.make_request(key, pki.identity("host", "h1"))
    assert pki.named(pki.load_request(pki.request_pem(csr))) == pki.identity("host", "h1")
    der = bytearray(csr.public_bytes(serialization.Encoding.DER))
    der[-1] ^= 1  # the signature's last byte: still a request, no longer its key's word
    pem = ssl.DER_cert_to_PEM_cert(bytes(der)).replace("CERTIFICATE", "CERTIFICATE REQUEST")
    with pytest.raises(TlsError, match="not signed by its own key"):
        pki.load_request(pem)


def _tls_dir(root: Path, ca: pki.Authority, who: pki.Identity, **kw: object) -> Path:
    key = pki.new_key()
    d = TlsDir(root / who.dns)
    d.write_ca(ca.cert)
    d.write_identity(key, pki.issue(ca, key.public_key(), who, **kw))  # type: ignore[arg-type]
    return d.path


def test_revocation_lists_are_taken_from_the_ca_only_and_only_forward(tmp_path: Path) -> None:
    ca = pki.make_ca()
    t = Trust(_tls_dir(tmp_path, ca, pki.identity("coordinator", "c1")))
    with pytest.raises(TlsError, match="no revocation list"):
        t.client_context()  # none yet: no handshake at all, rather than one unchecked
    assert t.set_crl(pki.crl_pem(pki.make_crl(ca, [], 2)))
    before = t.version
    assert not t.set_crl(pki.crl_pem(pki.make_crl(ca, [(7, dt.datetime.now(dt.UTC))], 1)))
    assert t.version == before and not t.revoked(7)
    with pytest.raises(TlsError, match="not the cluster CA's"):
        t.set_crl(pki.crl_pem(pki.make_crl(pki.make_ca(), [], 3)))
    assert t.set_crl(pki.crl_pem(pki.make_crl(ca, [(7, dt.datetime.now(dt.UTC))], 3)))
    assert t.revoked(7) and t.version != before
    ctx = t.client_context()
    assert (
        ctx.verify_flags & ssl.VERIFY_CRL_CHECK_LEAF
        and ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    )


def test_an_identity_is_refused_when_it_is_not_the_one_expected(tmp_path: Path) -> None:
    ca = pki.make_ca()
    d = _tls_dir(tmp_path, ca, pki.identity("host", "h2"))
    with pytest.raises(TlsError, match="is for host h2, not host h1"):
        Trust(d, expect=pki.identity("host", "h1"))
    (d / "identity.pem").chmod(0o640)
    with pytest.raises(TlsError, match="may be read by group or others"):
        Trust(d)


def test_a_rotated_identity_is_noticed_and_a_broken_one_keeps_the_old(tmp_path: Path) -> None:
    ca = pki.make_ca()
    who = pki.identity("host", "h1")
    d = _tls_dir(tmp_path, ca, who)
    t = Trust(d, expect=who)

    class Store:
        def tls_crl(self) -> str:
            return pki.crl_pem(pki.make_crl(ca, [], 1))

    t.refresh(Store())
    first = t.serial
    key = pki.new_key()
    TlsDir(d).write_identity(key, pki.issue(ca, key.public_key(), who))
    assert t.refresh(Store()) and t.serial != first
    second = t.serial
    (d / "identity.pem").write_bytes(b"half a file")  # replaced by hand, badly
    t.refresh(Store())
    assert t.serial == second  # still presents the one in use
