"""The values the cluster store takes and gives back, and the checks on what it takes.

Guarantees:

- A Space's access token is a ``Secret``: its ``repr``/``str`` are ``***``; only
  ``reveal()`` gives the value. ``SpaceRecord`` carries no token at all; the only record that
  does is ``SpaceConnection``, handed out to the holder of the current lease.
- Every name the store writes (host, space, session, coordinator, worker, run, campaign)
  matches ``NAME`` (it may later become a path or a shell word); addresses and tokens
  are printable without spaces; TTLs are positive and finite; tokens and generations
  are non-negative integers. Anything else is a ``ConfigError`` naming the field, before
  any SQL runs.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durable_spaces.errors import ConfigError
from durable_spaces.host.bounded import parse_json

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}$")
_PRINTABLE = re.compile(r"^[\x21-\x7e]{1,4096}$")  # visible ASCII, no spaces

HOST_STATES = ("up", "lost")
SPACE_STATES = ("unplaced", "ready")
SESSION_STATES = ("pending", "running", "done", "failed")
RUN_STATES = ("queued", "running", "done")


def check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise ConfigError(f"{what} {value!r}: use letters, digits and ._:@+=- (at most 200)")
    return value


def check_printable(what: str, value: object) -> str:
    if not isinstance(value, str) or not _PRINTABLE.match(value):
        raise ConfigError(f"{what}: must be visible ASCII without spaces, 1 to 4096 chars")
    return value


def check_ttl(what: str, value: object) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what} {value!r}: must be a positive number of seconds")
    return float(value)


def check_json(what: str, value: object) -> dict[str, Any]:
    """``value`` as it will read back from jsonb (tuples become lists, keys strings)."""
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object (a dict)")
    try:
        out: dict[str, Any] = parse_json(json.dumps(value, allow_nan=False), where=what)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what} is not JSON: {e}") from e
    return out


def check_int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{what} {value!r}: must be a non-negative integer")
    return value


class Secret:
    """A string that never shows itself in a repr, a log line or a traceback."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class Grant:
    """What the store gave one lease of a Space (``LeaseStatements.grant``)."""

    space: str
    lease: int
    holder: str
    epoch: int | None  # issued with this lease; None: the holder is no stored drive
    token_minted: bool  # the Space's token is already this lease's


@dataclass(frozen=True)
class HostRecord:
    id: str
    address: str
    backend: str
    state: str
    registered_at: datetime
    heartbeat_at: datetime


@dataclass(frozen=True)
class SpaceRecord:
    """A durable Space. ``generation`` counts placements from scratch (1 = the first);
    ``restored_from`` is ``new`` or ``from-scratch``; no token here."""

    name: str
    state: str
    generation: int
    restored_from: str
    placement_reason: str
    host_id: str | None
    address: str | None


@dataclass(frozen=True)
class SpaceConnection:
    """What a drive needs to reach its Space, given only for the current lease token."""

    space: str
    generation: int
    restored_from: str
    host_id: str
    address: str
    lease_token: int
    token: Secret = field(repr=False)


@dataclass(frozen=True)
class Lease:
    space: str
    token: int
    holder: str | None
    expires_at: datetime | None


@dataclass(frozen=True)
class Acquisition:
    """The answer to an acquisition: ``granted`` with the new ``token``, or pending with
    ``reason`` = ``held by session:<holder>``."""

    space: str
    session: str
    granted: bool
    token: int
    holder: str
    reason: str = ""


@dataclass(frozen=True)
class SessionRecord:
    name: str
    space: str | None
    state: str
    epoch: int
    lease_token: int | None
    attempts: int
    claimed_by: str | None
    claim_expires_at: datetime | None
    reason: str


@dataclass(frozen=True)
class Drive:
    """One drive's start: an ``epoch`` committed before it was returned, and the
    ``lease_token`` its driver must present; or ``pending`` (no epoch) with ``reason``."""

    session: str
    pending: bool
    epoch: int | None
    lease_token: int | None
    attempt: int
    reason: str = ""


@dataclass(frozen=True)
class Run:
    id: str
    campaign: str
    spec: dict[str, Any]
    state: str
    worker: str | None
    claim_expires_at: datetime | None
    attempts: int
    record: dict[str, Any] | None


@dataclass(frozen=True)
class Event:
    id: int
    at: datetime
    kind: str
    session: str | None
    space: str | None
    host: str | None
    detail: dict[str, Any]
