"""Where a placed durable Space answers: the ``address`` a host stores with its placement.

One string (the store keeps addresses printable, without spaces), read back by every
driver that connects, so it is parsed strictly here and nowhere else:

- ``spacesd``: ``http://<ip>:<port>/?root=<abs path>&instance=<id>&host=<ip>:<port>``: the
  Space's cua-spacesd listens at ``ip:port``, its workspace is ``root`` on that host,
  ``instance`` changes with every new sandbox (the adapter compares it with the log's to
  know the Space was placed again), and ``host`` is the host agent's API, which tells a
  driver whether the daemon is up and the same one (``durable_spaces/cluster/hostapi.py``).
  An optional ``user`` names the account the Space's files and commands belong to (a
  docker Space's ``cua``; ``ip:port`` is then the host agent's forward to the container).
- ``local``: ``local:///<abs state dir>?name=<local name>&instance=<id>``: a directory
  Space of the ``local`` backend. It is only reachable by drivers on the same machine (it
  is a directory, not a service); a driver elsewhere would find nothing there.

The Space's access token is never part of an address (``ClusterStore.connect`` hands it
out separately, to the current lease holder only).
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlsplit

from durable_spaces.errors import ConfigError

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_LOCAL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def check_endpoint(what: str, value: str) -> tuple[str, int]:
    """``ip:port`` (IPv4, or ``localhost``) as a pair; ``ConfigError`` otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} {value!r}: use ip:port")
    if host != "localhost":
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ConfigError(f"{what} {value!r}: the host must be an IPv4 address") from None
    return host, int(port)


def _abs_path(what: str, value: str) -> str:
    if not value.startswith("/") or posixpath.normpath(value) != value or "\x00" in value:
        raise ConfigError(f"{what} {value!r}: must be an absolute, normalized path")
    return value


def _one(query: dict[str, list[str]], key: str, address: str) -> str:
    values = query.get(key)
    if not values or len(values) != 1:
        raise ConfigError(f"space address {address!r}: needs exactly one {key}=")
    return values[0]


@dataclass(frozen=True)
class SpacesdAddress:
    daemon: str  # ip:port of the Space's cua-spacesd
    root: str  # the workspace on that host
    instance: str
    host_api: str  # ip:port of the host agent that provides it
    user: str | None = None  # whose files and commands (None: the daemon's own)

    @property
    def url(self) -> str:
        return f"http://{self.daemon}"

    def format(self) -> str:
        return (
            f"http://{self.daemon}/?root={quote(self.root, safe='/')}"
            f"&instance={quote(self.instance)}&host={quote(self.host_api, safe=':')}"
            + (f"&user={self.user}" if self.user else "")
        )


@dataclass(frozen=True)
class LocalAddress:
    state_dir: str  # the local backend's directory on the providing host
    name: str  # the Space's name in that backend
    instance: str

    def format(self) -> str:
        return (
            f"local://{quote(self.state_dir, safe='/')}?name={quote(self.name)}"
            f"&instance={quote(self.instance)}"
        )


SpaceAddress = SpacesdAddress | LocalAddress


def parse_address(address: str) -> SpaceAddress:
    """The address a host stored, checked field by field (``ConfigError`` names what is
    wrong): every part later becomes a URL, a path or a Space name."""
    try:
        parts = urlsplit(address)
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=True)
    except ValueError as e:
        raise ConfigError(f"space address {address!r} is malformed: {e}") from None
    instance = _one(query, "instance", address)
    if not _ID.match(instance):
        raise ConfigError(f"space address {address!r}: bad instance {instance!r}")
    if parts.scheme == "http":
        check_endpoint("space daemon", parts.netloc)
        if parts.path not in ("", "/") or parts.fragment:
            raise ConfigError(f"space address {address!r}: unexpected path or fragment")
        host_api = _one(query, "host", address)
        check_endpoint("host api", host_api)
        root = _abs_path("space root", _one(query, "root", address))
        user = _one(query, "user", address) if "user" in query else None
        if user is not None and not _USER.match(user):
            raise ConfigError(f"space address {address!r}: bad user {user!r}")
        return SpacesdAddress(parts.netloc, root, instance, host_api, user)
    if parts.scheme == "local":
        if parts.netloc or parts.fragment:
            raise ConfigError(f"space address {address!r}: use local:///<dir>?name=...")
        name = _one(query, "name", address)
        if not _LOCAL_NAME.match(name):
            raise ConfigError(f"space address {address!r}: bad local name {name!r}")
        return LocalAddress(_abs_path("local state dir", parts.path), name, instance)
    raise ConfigError(f"space address {address!r}: scheme must be http or local")
