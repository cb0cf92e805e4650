"""How a host API request proves it comes from the cluster: an HMAC of the request under
the cluster's host secret (``ClusterStore.host_secrets``), never the secret itself.

The secret lives in the store (``ds.host_secrets``, made with the schema): every machine
that may call a host (coordinators, drivers) or serve one (host agents) reads it with
its database credentials, so the database stays the one thing a machine must be given.
A request carries ``Authorization: DS-HMAC v=<version>,t=<unix secs>,s=<hex>`` where
``s`` is HMAC-SHA256 over ``t``, the method, the path with its query, and the body's
SHA-256. The host accepts the newest ``ACCEPTED`` versions (a rotation does not cut off a
caller that has not read the new one yet) and a ``t`` within ``SKEW_SECS`` of its clock.
A request seen on the wire can be replayed within that window; every request the API
serves is idempotent and checked against the store, so a replay only repeats an answer.
The answers themselves are not encrypted: docs/cluster-security.md says what that leaves.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from durable_spaces.cluster.records import Secret
from durable_spaces.errors import HostAuthError

SCHEME = "DS-HMAC"
#: How many of the newest secret versions a host accepts.
ACCEPTED = 2
#: How far a request's time may be from the host's clock.
SKEW_SECS = 300
_HEADER = re.compile(r"^DS-HMAC v=([0-9]{1,9}),t=([0-9]{1,12}),s=([0-9a-f]{64})$")


@dataclass(frozen=True)
class HostSecret:
    version: int
    key: Secret

    def __repr__(self) -> str:
        return f"HostSecret(version={self.version})"


def _mac(key: Secret, t: int, method: str, target: str, body: bytes) -> str:
    text = f"{t}\n{method}\n{target}\n{hashlib.sha256(body).hexdigest()}".encode()
    return hmac.new(key.reveal().encode(), text, hashlib.sha256).hexdigest()


def sign(
    secret: HostSecret, method: str, target: str, body: bytes, now: float | None = None
) -> str:
    """The ``Authorization`` value of a request (``target``: path and query)."""
    t = int(time.time() if now is None else now)
    return f"{SCHEME} v={secret.version},t={t},s={_mac(secret.key, t, method, target, body)}"


def verify(
    header: str | None,
    accepted: Sequence[HostSecret],
    method: str,
    target: str,
    body: bytes,
    now: float | None = None,
) -> None:
    """Returns when ``header`` signs this request with an accepted secret; else
    ``HostAuthError`` saying which check failed (never what the right value was)."""
    if not header:
        raise HostAuthError("the request is not authenticated (no Authorization header)")
    m = _HEADER.match(header)
    if m is None:
        raise HostAuthError(f"the Authorization header is not {SCHEME} v=,t=,s=")
    version, t, mac = int(m[1]), int(m[2]), m[3]
    if abs((time.time() if now is None else now) - t) > SKEW_SECS:
        raise HostAuthError(f"the request's time is more than {SKEW_SECS} s from the host's")
    for s in accepted:
        if s.version == version:
            if hmac.compare_digest(_mac(s.key, t, method, target, body), mac):
                return
            raise HostAuthError("the request's signature does not match the cluster's secret")
    raise HostAuthError(f"host secret version {version} is not accepted here")


__all__ = ["ACCEPTED", "SKEW_SECS", "HostSecret", "sign", "verify"]
