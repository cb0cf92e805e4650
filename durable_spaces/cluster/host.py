"""The host agent: a machine that provides durable Spaces directly to the cluster.

``durable-spaces host --db URL --backend spacesd|docker|local --id ID --address IP:PORT`` runs
one. What it guarantees:

- It registers in the store and heartbeats every ``heartbeat_secs``. When the store
  declared it lost (``HostLostError``: its Spaces were put up for placement elsewhere), it
  deletes every Space it provided and registers again: a host never serves a generation
  the store moved on from.
- It places a Space only when asked for a generation the store has waiting for placement
  (``hostapi.py``'s ``POST /v1/place``): it creates a fresh sandbox with its backend
  (one sandbox per generation, named after Space and generation), then records address and
  token in the store. If another host won that generation, its copy is deleted.
- It rotates a Space's access token for each new lease (``hostapi.py``'s ``POST
  /v1/rotate``, asked by the coordinator before every drive): only when the store says the
  lease is the current one; the daemon refuses the old token before the new one is
  recorded, and a daemon floor above the epoch the store issued with the lease is taken
  back to it (``durable_spaces/backends/spacesd/backend.py``'s ``rotate_token``).
- It serves its API over mutual TLS with the certificate of ``host <id>`` in its TLS
  directory, only to the cluster's coordinators and workers (``hostserver.py``); it reads
  the CA's revocation list from the store at start and with every heartbeat (a newer one
  cuts the connections of the certificates it names), and a rotated certificate with it.
- It is the only one that declares a Space it was given lost (``ClusterStore.space_lost``,
  which names this host): the moment it learns the sandbox is gone (a status request, or
  the sweep every ``sweep_secs``), and when the store places a generation here that it
  does not provide (its state was lost with its disk). The sweep also boots a sandbox
  whose daemon died (as the machine would), and deletes a sandbox only once the store
  says its generation is gone: moved to a newer one, or the Space removed (a restart of
  the agent adopts the others: ``provided.json`` in its state dir lists what it provided).

Backends: ``spacesd`` daemons listen on the host's address (``listen_host``), so drivers on
other machines reach them; ``docker`` containers publish their daemon on loopback, so the
agent forwards a port of ``listen_host`` to each (``forward.py``; the port is kept across
agent restarts, the forward lives as long as the agent); ``local`` Spaces are
directories, reachable only by drivers on this same machine (``address.py``). Store calls
block, so they run in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from durable_spaces.backends import open_backend
from durable_spaces.cluster.address import LocalAddress, SpacesdAddress, check_endpoint
from durable_spaces.cluster.database import describe
from durable_spaces.cluster.forward import PortForward
from durable_spaces.cluster.hostroutes import make_app
from durable_spaces.cluster.hostserver import Limits, Listener
from durable_spaces.cluster.pki import identity
from durable_spaces.cluster.records import SpaceRecord
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.cluster.tls import Trust
from durable_spaces.errors import (
    ClusterConflictError,
    ClusterError,
    ConfigError,
    HostLostError,
    UnknownRecordError,
)
from durable_spaces.host.bounded import load_object
from durable_spaces.space import Space, SpaceBackend, space_name

log = logging.getLogger(__name__)

HOST_BACKENDS = ("spacesd", "docker", "local")
PROVIDED_FILE = "provided.json"


def local_name(space: str, generation: int) -> str:
    """The sandbox of one generation of a durable Space on its host (a valid name for
    every backend): a new generation is a new sandbox, never the old one reused."""
    return space_name(f"{space}@{generation}", prefix="dsc")


@dataclass(frozen=True)
class Provided:
    space: str
    generation: int
    address: str
    forward_port: int = 0  # docker: the port of listen_host forwarded to the container


class HostAgent:
    """One host's agent (see the module doc). ``address``: ``ip:port`` of its API; the
    Spaces' daemons listen on ``listen_host`` (default: the address's ip)."""

    def __init__(
        self,
        db_url: str,
        host_id: str,
        address: str,
        backend: str,
        state_dir: str | Path,
        *,
        tls_dir: str | Path | None,
        listen_host: str | None = None,
        heartbeat_secs: float = 1.0,
        sweep_secs: float = 2.0,
        limits: Limits | None = None,
    ) -> None:
        describe(db_url)  # a malformed or empty URL first, before anything is read
        if backend not in HOST_BACKENDS:
            raise ConfigError(f"host backend {backend!r}: use one of {', '.join(HOST_BACKENDS)}")
        api_ip, _ = check_endpoint("host address", address)
        if tls_dir is None:
            raise ConfigError(
                "a host needs its TLS directory (--tls-dir): enrol it with"
                " durable-spaces tls enroll --role host"
            )
        #: What it presents and accepts: its own certificate must name this host.
        self.trust = Trust(tls_dir, expect=identity("host", host_id))
        self.limits = limits
        self.api: Listener | None = None
        self.host_id = host_id
        self.address = address
        self.backend_name = backend
        self.state_dir = Path(state_dir).absolute()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.heartbeat_secs = heartbeat_secs
        self.sweep_secs = sweep_secs
        self.listen_host = listen_host or api_ip
        self.store = ClusterStore(db_url)
        options: dict[str, Any] = {}
        if backend == "spacesd":
            options["listen_host"] = self.listen_host
        self.backend: SpaceBackend = open_backend(backend, self.state_dir / "spaces", **options)
        self._provided: dict[str, Provided] = self._load()
        self._spaces: dict[str, Space] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._forwards: dict[str, PortForward] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stopping = asyncio.Event()

    def __repr__(self) -> str:
        return f"HostAgent({self.host_id!r}, {self.address!r}, {self.backend_name!r})"

    # -- what it provided, on disk -------------------------------------------------------

    def _load(self) -> dict[str, Provided]:
        """What an earlier run provided; an entry whose name does not match its Space and
        generation is ignored (the sweep then deletes that sandbox as a leftover)."""
        try:
            raw = load_object(self.state_dir / PROVIDED_FILE)  # a FIFO, too big, too deep: refused
            provided = {k: Provided(**v) for k, v in raw.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, AttributeError) as e:
            raise ConfigError(f"{self.state_dir / PROVIDED_FILE} is malformed: {e}") from None
        return {k: p for k, p in provided.items() if k == local_name(p.space, p.generation)}

    def _save(self) -> None:
        tmp = self.state_dir / f".{PROVIDED_FILE}.tmp"
        tmp.write_text(json.dumps({k: asdict(v) for k, v in self._provided.items()}))
        os.replace(tmp, self.state_dir / PROVIDED_FILE)

    # -- placing -------------------------------------------------------------------------

    def _spaces_dir(self) -> Path:
        return Path(getattr(self.backend, "state_dir", self.state_dir / "spaces"))

    async def _address(self, local: str, space: Space, forward_port: int = 0) -> tuple[str, str]:
        """(address, token) of a sandbox just created (or adopted again)."""
        if self.backend_name == "local":
            state_dir = str(self._spaces_dir())
            # Directories have no access control: the token only satisfies the store.
            return LocalAddress(state_dir, local, space.instance_id).format(), secrets.token_hex(8)
        token = str(getattr(space, "_token", ""))
        user = getattr(space, "_user", None)
        if self.backend_name == "docker":
            port = await self._forward(local, forward_port)
            daemon = f"{self.listen_host}:{port}"
        else:
            daemon = str(getattr(space, "_url", "")).removeprefix("http://")
        addr = SpacesdAddress(daemon, space.root, space.instance_id, self.address, user)
        return addr.format(), token

    def _container_port(self, local: str) -> int | None:
        port = getattr(self._spaces.get(local), "port", None)
        return port if isinstance(port, int) else None

    async def _forward(self, local: str, port: int) -> int:
        """A forward of ``listen_host:port`` (0: a free one) to the container's port."""
        fwd = self._forwards.get(local)
        if fwd is None:
            fwd = PortForward(
                self.listen_host, lambda: getattr(self._spaces.get(local), "port", None)
            )
            await fwd.start(port)
            self._forwards[local] = fwd
        return fwd.port

    async def place(self, space: str, generation: int) -> dict[str, Any]:
        local = local_name(space, generation)
        async with self._locks.setdefault(local, asyncio.Lock()):
            sp = await asyncio.to_thread(self.store.space, space)
            if (sp.state, sp.generation, sp.host_id) == ("ready", generation, self.host_id):
                return {"address": sp.address, "generation": generation}  # a repeat
            if sp.state != "unplaced" or sp.generation != generation:
                raise ClusterConflictError(
                    f"space {space}: generation {generation} is not waiting for placement"
                    f" (generation {sp.generation} is {sp.state})"
                )
            sandbox = await self.backend.create(local)
            self._spaces[local] = sandbox
            address, token = await self._address(local, sandbox)
            try:
                await asyncio.to_thread(
                    self.store.place_space, space, generation, self.host_id, address, token
                )
            except (ClusterConflictError, HostLostError):
                await self._drop(local)  # another host won, or we are lost
                raise
            port = self._forwards[local].port if local in self._forwards else 0
            self._provided[local] = Provided(space, generation, address, port)
            self._save()
        log.info("placed %s generation %d as %s", space, generation, local)
        return {"address": address, "generation": generation}

    async def rotate(self, space: str, generation: int, lease: int) -> dict[str, Any]:
        """A new access token for lease ``lease`` (the module doc); a repeat, or a lease
        whose placement minted the token, changes nothing."""
        local = local_name(space, generation)
        async with self._locks.setdefault(local, asyncio.Lock()):
            if local not in self._provided:
                raise ClusterConflictError(
                    f"space {space}: generation {generation} is not provided by {self.host_id}"
                )
            grant = await asyncio.to_thread(self.store.grant, space, lease)
            if grant.token_minted:
                return {"rotated": False}
            rotate = getattr(self.backend, "rotate_token", None)
            if rotate is None:  # a directory: no daemon, nothing to refuse (module doc)
                token = secrets.token_hex(8)
            else:
                token = await rotate(local, grant.epoch)
                sandbox = await self.backend.find(local)
                if sandbox is not None:
                    self._spaces[local] = sandbox
            await asyncio.to_thread(
                self.store.set_space_token, space, generation, self.host_id, lease, token
            )
        log.info("rotated the token of %s generation %d for lease %d", space, generation, lease)
        return {"rotated": True}

    # -- status and sweeping -------------------------------------------------------------

    def _gone(self, local: str) -> bool | None:
        """True when the sandbox was removed, False when it exists; None when unsure."""
        sandbox = self._spaces.get(local)
        probe = getattr(sandbox, "_probe", None)
        if probe is not None:
            return bool(probe.gone())
        if self.backend_name == "local":
            return not (self._spaces_dir() / local).is_dir()
        return None

    def _boot(self, local: str) -> str | None:
        probe = getattr(self._spaces.get(local), "_probe", None)
        if probe is not None:
            boot = probe.boot_id()
            return None if boot is None else str(boot)
        return "local"

    async def _report_gone(self, local: str, why: str) -> None:
        p = self._provided.pop(local, None)
        self._spaces.pop(local, None)
        self._save()
        fwd = self._forwards.pop(local, None)
        if fwd is not None:
            await fwd.close()
        if p is not None:
            await self._report_lost(p.space, p.generation, why)

    async def _report_lost(self, space: str, generation: int, why: str) -> None:
        reason = f"{why} on host {self.host_id}"
        await asyncio.to_thread(self.store.space_lost, space, generation, reason, host=self.host_id)
        log.warning("space %s generation %d is gone: %s", space, generation, why)

    async def status(self, space: str, generation: int) -> dict[str, Any]:
        """The probes run in a thread (a daemon's may wait); the report of a gone sandbox
        under the sandbox's lock, like every change to what it provides."""
        local = local_name(space, generation)
        if local not in self._provided or local not in self._spaces:
            return {"state": "unknown", "boot": None}
        if await asyncio.to_thread(self._gone, local):
            async with self._locks.setdefault(local, asyncio.Lock()):
                if local in self._provided:
                    await self._report_gone(local, "the sandbox was removed")
            return {"state": "gone", "boot": None}
        boot = await asyncio.to_thread(self._boot, local)
        return {"state": "up" if boot else "down", "boot": boot}

    @staticmethod
    def _moved_on(p: Provided, now: SpaceRecord | None) -> bool:
        """Whether the store says ``p``'s generation is gone (module doc)."""
        return now is None or now.generation > p.generation

    async def sweep(self) -> None:
        """Boot what died, report what is gone or missing, delete what the store moved on
        from (module doc)."""
        records = {s.name: s for s in await asyncio.to_thread(self.store.spaces)}
        for local, p in list(self._provided.items()):
            async with self._locks.setdefault(local, asyncio.Lock()):
                if local not in self._provided:
                    continue
                if self._moved_on(p, records.get(p.space)):
                    await self._drop(local)
                    continue
                sandbox = await self.backend.find(local)  # boots a daemon that died
                if sandbox is None:
                    await self._report_gone(local, "the sandbox is gone")
                    continue
                self._spaces[local] = sandbox
                if self.backend_name == "docker" and local not in self._forwards:
                    await self._forward(local, p.forward_port)  # adopted after a restart
        for sp in records.values():  # placed here, not provided: this host's word
            if sp.state != "ready" or sp.host_id != self.host_id:
                continue
            local = local_name(sp.name, sp.generation)
            async with self._locks.setdefault(local, asyncio.Lock()):
                if local not in self._provided:
                    await self._report_lost(sp.name, sp.generation, "not provided (state lost)")
        for local in await self.backend.names():  # leftovers of a placement cut short
            if local not in self._provided and not self._locks.get(local, asyncio.Lock()).locked():
                await self.backend.delete(local)

    async def _drop(self, local: str) -> None:
        self._provided.pop(local, None)
        self._spaces.pop(local, None)
        self._save()
        fwd = self._forwards.pop(local, None)
        if fwd is not None:
            await fwd.close()
        with contextlib.suppress(Exception):
            await self.backend.delete(local)

    async def drop_all(self) -> None:
        for local in list(self._provided):
            await self._drop(local)

    # -- the loops -----------------------------------------------------------------------

    async def _register(self) -> None:
        await asyncio.to_thread(
            self.store.register_host, self.host_id, self.address, self.backend_name
        )

    async def _refresh_trust(self) -> None:
        """The newest revocation list (and a rotated certificate); a newer list cuts the
        connections of the certificates it names."""
        if await asyncio.to_thread(self.trust.refresh, self.store) and self.api is not None:
            self.api.revoke()

    async def _heartbeat(self) -> None:
        while not self.stopping.is_set():
            try:
                await asyncio.to_thread(self.store.heartbeat_host, self.host_id)
                await self._refresh_trust()  # a revocation is taken within a beat
            except HostLostError:
                log.warning("host %s was declared lost: dropping its Spaces", self.host_id)
                await self.drop_all()
                await self._register()
            except UnknownRecordError:
                await self._register()
            except ClusterError as e:  # the database is away: keep trying
                log.warning("heartbeat failed: %s", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.heartbeat_secs)

    async def _sweeper(self) -> None:
        while not self.stopping.is_set():
            try:
                await self.sweep()
            except Exception as e:  # the sweep is housekeeping: the next one retries
                log.warning("sweep failed: %s: %s", type(e).__name__, e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.sweep_secs)

    async def run(self) -> None:
        """Serve until ``stopping`` is set (SIGTERM / SIGINT set it). Spaces stay up: an
        agent that restarts adopts them."""
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self._loop.add_signal_handler(sig, self.stopping.set)
        await self._register()
        await self._refresh_trust()
        await self.sweep()  # adopt what an earlier run of this agent provided
        self.api = Listener(self.address, make_app(self), self.trust, limits=self.limits)
        await self.api.start()
        log.info("host %s serving on %s (%s)", self.host_id, self.address, self.backend_name)
        try:
            await asyncio.gather(self._heartbeat(), self._sweeper())
        finally:
            await self.api.close()
            for fwd in self._forwards.values():
                await fwd.close()
            await self.backend.close()
            self.store.close()
