"""Backend ``remote``: a driver's view of durable Spaces that host agents provide.

``find(name)`` asks the store where the Space runs, with the session's lease token
(``ClusterStore.connect``: only the current holder gets the Space's token, one its host
minted for this lease; every older driver's token is refused by the daemon), and returns a
``SpacesdSpace`` pointed at the host's daemon (or, for a ``local`` host on this same
machine, the directory). Its configuration comes from the driver's environment, which the
cluster coordinator (``durable_spaces/cluster/drive.py``) sets for every drive:
``CUA_CLUSTER_DB`` (the store's URL), ``CUA_SESSION_NAME``, ``CUA_SESSION_LEASE_TOKEN``,
``CUA_CLUSTER_TLS_DIR`` (the coordinator's TLS directory: a driver asks hosts as its
coordinator, and takes answers only from the host its Space is placed on).

Decisions:

- A Space waiting for placement is not found (None), and ``create`` refuses it
  (``SpaceUnavailableError``): only the coordinator places Spaces, so the driver halts and
  the next drive gets the new placement. A superseded lease token is ``StaleEpochError``:
  a newer drive exists, this driver is fenced (exit 75).
- ``restart``, ``kill_daemon`` and ``delete`` are not a driver's to do: they raise
  ``CapabilityMissingError``. A Space's sandbox belongs to its host agent; to remove one,
  remove it on its host (the agent then reports it gone and it is placed again).
- The probe asks the host agent (``hostapi.py``) about the daemon every ``POLL_SECS``
  from a thread of its own, so ``boot_id()`` stays cheap: an unreachable host or a down
  daemon is ``None`` (a pending read is abandoned), a restarted daemon a new identity
  (noticed within one poll). ``gone()`` is true once the host reports the sandbox gone or
  the store has moved the Space to another generation (its host was lost); a host's
  ``unknown`` is no such word (the host reports a loss to the store itself). A driver whose
  Space's host stopped answering asks the store every ``STORE_CHECK_SECS``; once the
  store moved on from its generation, the process halts at once (exit 1, crashed: the
  coordinator places the Space again and resumes), since a call to the dead address may
  never return.
- The driver holds its lease actively: once it found its Space it renews the lease every
  heartbeat interval (``CUA_SESSION_HEARTBEAT_SECS``) from a thread of its own. A renewal
  refused because a newer drive superseded the token (``LeaseLostError``, counted in the
  store) ends the process at once with exit 75 (fenced), before it can touch the Space
  again; the log's fence would stop it at its next commit anyway, this stops it idle too.
  A store that is away only postpones the renewal.
- A docker Space (its address names a ``user``) is a ``RemoteContainerSpace``: files and
  commands as that user, through the host agent's forward.
- Remote Spaces do not sweep processes their daemon does not track when the epoch rises
  (the local ``spacesd`` and ``docker`` backends do): background leftovers of an older command
  may outlive the advance on the host. The daemon's own AdvanceEpoch still kills every
  command it tracks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from durable_spaces.backends.docker.docker_space import DockerSpace
from durable_spaces.backends.local import LocalSpace
from durable_spaces.backends.spacesd.spacesd_space import SpacesdSpace, SweepWhen
from durable_spaces.cluster.address import LocalAddress, SpacesdAddress, parse_address
from durable_spaces.cluster.hostapi import HostClient, HostClients
from durable_spaces.cluster.records import SpaceConnection, check_int, check_name
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.cluster.tls import Trust
from durable_spaces.drive import protocol
from durable_spaces.errors import (
    CapabilityMissingError,
    ClusterError,
    ClusterUnavailableError,
    ConfigError,
    HostApiError,
    LeaseLostError,
    SpaceUnavailableError,
    StaleEpochError,
)
from durable_spaces.settings import Settings
from durable_spaces.space import Space

POLL_SECS = 0.25
#: While its host does not answer, how often a probe asks the store about its Space.
STORE_CHECK_SECS = 1.0
#: How often a driver reads the CA's revocation list again (a revoked host is refused).
CRL_CHECK_SECS = 5.0
DB_ENV = "CUA_CLUSTER_DB"
TOKEN_ENV = "CUA_SESSION_LEASE_TOKEN"
TLS_ENV = "CUA_CLUSTER_TLS_DIR"


class RemoteProbe:
    """``DaemonProbe`` of one placed generation, from its host agent's answers."""

    def __init__(self, backend: RemoteBackend, conn: SpaceConnection, host_api: str) -> None:
        self._backend = backend
        self._space = conn.space
        self._generation = conn.generation
        self._host_id = conn.host_id
        self._host_api = host_api
        self._boot: str | None = None
        self._gone = False
        self._host_says_gone = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = threading.Lock()

    def _poll(self) -> None:
        try:
            host = self._backend.host_client(self._host_id, self._host_api)
            st = host.status(self._space, self._generation)
        except (HostApiError, ClusterError, ConfigError):  # no answer it could use
            self._boot = None
            return
        self._host_says_gone = st["state"] == "gone"
        boot = st.get("boot") if st["state"] == "up" else None
        self._boot = f"{self._generation}:{boot}" if boot else None

    def _run(self) -> None:
        checked = 0.0
        while not self._stop.wait(POLL_SECS):
            self._poll()
            if self._boot is not None and not self._host_says_gone:
                continue
            now = time.monotonic()
            if now - checked < STORE_CHECK_SECS:
                continue
            checked = now
            if self._backend.moved_on(self._space, self._generation) is True:
                # Bound to a generation the cluster moved on from (its host was declared
                # lost, or it reported the sandbox gone): nothing this drive does can
                # reach it any more, and a call to a dead address may never return.
                print(
                    f"durable-spaces driver: halted: Space {self._space} generation "
                    f"{self._generation} is gone from the cluster",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(protocol.EXIT_CRASHED)

    def _ensure_polling(self) -> None:
        with self._started:
            if self._thread is None:
                self._poll()  # the first answer is waited for: spawn compares against it
                self._thread = threading.Thread(
                    target=self._run, name=f"ds-probe-{self._space}", daemon=True
                )
                self._thread.start()

    def boot_id(self) -> str | None:
        self._ensure_polling()
        return self._boot

    def gone(self) -> bool:
        if not self._gone:
            self._ensure_polling()
            moved = self._backend.moved_on(self._space, self._generation)
            self._gone = moved is True or (self._host_says_gone and moved is not False)
        return self._gone

    def close(self) -> None:
        self._stop.set()


class RemoteContainerSpace(DockerSpace):
    """A docker Space on another host, reached through its agent's forward: commands and
    files as the Space's user, like ``DockerSpace``; raising the epoch does not sweep the
    container (only its host could: see the module doc)."""

    def __init__(
        self,
        name: str,
        addr: SpacesdAddress,
        token: str,
        probe: RemoteProbe,
        sdk_home: str,
        settings: Settings,
    ) -> None:
        # DockerSpace's own constructor wants the engine; this one only has an address.
        SpacesdSpace.__init__(
            self,
            name,
            addr.root,
            addr.instance,
            addr.url,
            token,
            probe,
            kind="container",
            user=addr.user,
            sdk_home=sdk_home,
            settings=settings,
        )
        self.container_id = addr.instance
        self.port = int(addr.daemon.rpartition(":")[2])

    def __repr__(self) -> str:  # never shows the token
        return f"RemoteContainerSpace({self.name!r}, {self._url!r})"

    def _sweep_when(self) -> SweepWhen:
        return "never"  # only the container's host could sweep it


class LeaseKeeper:
    """Renews one drive's lease until the process ends (see the module doc)."""

    def __init__(self, backend: RemoteBackend, space: str, every: float) -> None:
        self._backend = backend
        self._space = space
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ds-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        b = self._backend
        store = ClusterStore(b._url, create=False, reconnect_secs=max(5.0, self._every))
        try:
            while not self._stop.wait(self._every):
                try:
                    store.renew_lease(self._space, b.session, b.lease_token)
                except LeaseLostError as e:
                    print(f"durable-spaces driver: fenced: {e}", file=sys.stderr, flush=True)
                    os._exit(protocol.EXIT_FENCED)  # nothing more of this drive may run
                except ClusterError as e:
                    print(f"durable-spaces driver: lease renewal: {e}", file=sys.stderr)
        finally:
            store.close()

    def close(self) -> None:
        self._stop.set()


class RemoteBackend:
    """Durable Spaces of the cluster, as one driver session sees them (module doc)."""

    kind = "remote"

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        db: str | None = None,
        session: str | None = None,
        lease_token: int | None = None,
        env: Mapping[str, str] | None = None,
        settings: Settings | None = None,
    ) -> None:
        e = os.environ if env is None else env
        #: The product's settings (``durable_spaces/settings.py``), read now if not given.
        self.settings = Settings.from_env(e) if settings is None else settings
        self.state_dir = Path(state_dir).absolute()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        url = db or e.get(DB_ENV, "")
        if not url:
            raise ConfigError(f"{DB_ENV} is not set: the remote backend needs the store's URL")
        self.session = check_name("session", session or e.get(protocol.NAME, ""))
        if lease_token is not None:
            self.lease_token = check_int("lease token", lease_token)
        else:
            self.lease_token = protocol.parse_epoch(TOKEN_ENV, e.get(TOKEN_ENV, ""))
        self._tls_dir = e.get(TLS_ENV) or None
        self._trust: Trust | None = None
        self._hosts: HostClients | None = None
        self._trust_lock = threading.Lock()
        hb = e.get(protocol.HEARTBEAT_SECS, "5")
        self.renew_secs = protocol.parse_seconds(
            protocol.HEARTBEAT_SECS, hb, lo=protocol.MIN_HEARTBEAT_S, hi=protocol.MAX_HEARTBEAT_S
        )
        self._url = url
        self._store: ClusterStore | None = None
        self._probe_store: ClusterStore | None = None
        self._spaces: dict[str, tuple[int, str, Space]] = {}
        self._probes: list[RemoteProbe] = []
        self._keepers: dict[str, LeaseKeeper] = {}

    def __repr__(self) -> str:
        return f"RemoteBackend(session={self.session!r}, lease_token={self.lease_token})"

    def _db(self) -> ClusterStore:
        if self._store is None:
            self._store = ClusterStore(self._url, create=False)
        return self._store

    def host_client(self, host_id: str, address: str) -> HostClient:
        """A client of host ``host_id`` as the coordinator's identity, with a revocation
        list at most ``CRL_CHECK_SECS`` old (``TlsError``/``ClusterError`` when neither a
        list nor the TLS directory can be had)."""
        with self._trust_lock:
            if self._trust is None:
                if self._tls_dir is None:
                    raise ConfigError(
                        f"{TLS_ENV} is not set: a driver asks hosts with its coordinator's"
                        " certificate"
                    )
                self._trust = Trust(self._tls_dir)
                self._hosts = HostClients(self._trust, timeout=1.0)
            # the drive's own store, connected by find: no second connection on the way
            self._trust.refresh(self._db(), every=CRL_CHECK_SECS)
            assert self._hosts is not None
            return self._hosts.get(host_id, address)

    def _probe_db(self) -> ClusterStore:
        if self._probe_store is None:
            self._probe_store = ClusterStore(self._url, create=False, reconnect_secs=3.0)
        return self._probe_store

    def moved_on(self, space: str, generation: int) -> bool | None:
        """Has the store moved ``space`` past ``generation`` (or put it up for placement
        again)? None when the store cannot say now. Asked on error paths only."""
        try:
            sp = self._probe_db().space(space)
        except ClusterError:
            return None
        return sp.generation != generation or sp.state != "ready"

    async def _connect(self, name: str) -> SpaceConnection | None:
        try:
            return await asyncio.to_thread(self._db().connect, name, self.session, self.lease_token)
        except SpaceUnavailableError:
            return None  # waiting for placement: the coordinator places it
        except LeaseLostError as e:
            raise StaleEpochError(self.lease_token, e.current, f"lease of Space {name}") from e
        except ClusterUnavailableError as e:
            raise SpaceUnavailableError(f"the cluster store is unreachable: {e}") from e

    def _open(self, name: str, conn: SpaceConnection) -> Space:
        addr = parse_address(conn.address)
        if isinstance(addr, LocalAddress):
            return LocalSpace(name, Path(addr.state_dir) / addr.name, addr.instance)
        assert isinstance(addr, SpacesdAddress)
        probe = RemoteProbe(self, conn, addr.host_api)
        self._probes.append(probe)
        home = self.state_dir / ".cua-sdk"
        home.mkdir(mode=0o700, exist_ok=True)
        if addr.user is not None:
            token = conn.token.reveal()
            return RemoteContainerSpace(name, addr, token, probe, str(home), self.settings)
        return SpacesdSpace(
            name,
            addr.root,
            addr.instance,
            addr.url,
            conn.token.reveal(),
            probe,
            sdk_home=str(home),
            settings=self.settings,
        )

    async def find(self, name: str) -> Space | None:
        check_name("space", name)
        conn = await self._connect(name)
        if conn is None:
            return None
        cached = self._spaces.get(name)
        if cached is not None and cached[:2] == (conn.generation, conn.address):
            return cached[2]
        space = self._open(name, conn)
        self._spaces[name] = (conn.generation, conn.address, space)
        if name not in self._keepers and self.renew_secs > 0:
            self._keepers[name] = LeaseKeeper(self, name, self.renew_secs)
        return space

    async def create(self, name: str) -> Space:
        space = await self.find(name)
        if space is None:
            raise SpaceUnavailableError(
                f"Space {name} is waiting for placement: the coordinator places it"
            )
        return space

    def _not_mine(self, op: str, name: str) -> CapabilityMissingError:
        return CapabilityMissingError(
            f"{op} of remote Space {name}: a driver cannot; its host agent owns the sandbox"
        )

    async def restart(self, name: str) -> None:
        raise self._not_mine("restart", name)

    async def kill_daemon(self, name: str) -> None:
        raise self._not_mine("kill_daemon", name)

    async def delete(self, name: str) -> None:
        raise self._not_mine("delete", name)

    async def names(self) -> list[str]:
        return []  # a driver holds no Spaces of its own

    async def close(self) -> None:
        for probe in self._probes:
            probe.close()
        for keeper in self._keepers.values():
            keeper.close()
        for _, _, space in self._spaces.values():
            with contextlib.suppress(Exception):
                await space.close()
        self._spaces.clear()
        if self._hosts is not None:
            self._hosts.close()
        for store in (self._store, self._probe_store):
            if store is not None:
                store.close()
        self._store = self._probe_store = None


def connection_env(db_url: str, lease_token: int, tls_dir: str | Path) -> dict[str, str]:
    """The variables a driver needs to reach its remote Space (besides CUA_SESSION_*)."""
    return {DB_ENV: db_url, TOKEN_ENV: str(lease_token), TLS_ENV: str(tls_dir)}


__all__ = ["RemoteBackend", "RemoteProbe", "connection_env"]
