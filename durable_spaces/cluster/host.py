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
- It serves its API only to callers that sign with the cluster's host secret, which it
  reads from the store at start and with every heartbeat (``hostauth.py``).
- It reports a Space whose sandbox is definitely gone (``ClusterStore.space_lost``) the
  moment it learns it: on a status request, and in a sweep every ``sweep_secs``. The sweep
  also boots a sandbox whose daemon died (as the machine would), and deletes sandboxes of
  generations the store no longer places here (a restart of the agent adopts the others:
  ``provided.json`` in its state dir lists what it provided).

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
from collections.abc import Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from durable_spaces.backends import open_backend
from durable_spaces.cluster.address import LocalAddress, SpacesdAddress, check_endpoint
from durable_spaces.cluster.forward import PortForward
from durable_spaces.cluster.hostapi import HostApiServer
from durable_spaces.cluster.hostauth import HostSecret
from durable_spaces.cluster.store import ClusterStore
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
        listen_host: str | None = None,
        heartbeat_secs: float = 1.0,
        sweep_secs: float = 2.0,
    ) -> None:
        if backend not in HOST_BACKENDS:
            raise ConfigError(f"host backend {backend!r}: use one of {', '.join(HOST_BACKENDS)}")
        api_ip, _ = check_endpoint("host address", address)
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
        self._secrets: list[HostSecret] = []
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
            reason = f"{why} on host {self.host_id}"
            await asyncio.to_thread(self.store.space_lost, p.space, p.generation, reason)
            log.warning("space %s generation %d is gone: %s", p.space, p.generation, why)

    def status(self, space: str, generation: int) -> dict[str, Any]:
        """Answered from an API thread: only cheap, synchronous probes (the report of a
        gone sandbox runs on the agent's loop, like every change to what it provides)."""
        local = local_name(space, generation)
        if local not in self._provided or local not in self._spaces:
            return {"state": "unknown", "boot": None}
        if self._gone(local):
            assert self._loop is not None
            asyncio.run_coroutine_threadsafe(
                self._report_gone(local, "the sandbox was removed"), self._loop
            ).result(timeout=60)
            return {"state": "gone", "boot": None}
        boot = self._boot(local)
        return {"state": "up" if boot else "down", "boot": boot}

    async def sweep(self) -> None:
        """Boot what died, report what is gone, delete what the store moved on from."""
        placed = {
            (s.name, s.generation)
            for s in await asyncio.to_thread(self.store.spaces, "ready")
            if s.host_id == self.host_id
        }
        for local, p in list(self._provided.items()):
            async with self._locks.setdefault(local, asyncio.Lock()):
                if local not in self._provided:
                    continue
                if (p.space, p.generation) not in placed:
                    await self._drop(local)
                    continue
                sandbox = await self.backend.find(local)  # boots a daemon that died
                if sandbox is None:
                    await self._report_gone(local, "the sandbox is gone")
                    continue
                self._spaces[local] = sandbox
                if self.backend_name == "docker" and local not in self._forwards:
                    await self._forward(local, p.forward_port)  # adopted after a restart
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

    async def _read_secrets(self) -> None:
        self._secrets = await asyncio.to_thread(self.store.host_secrets)

    async def _heartbeat(self) -> None:
        while not self.stopping.is_set():
            try:
                await asyncio.to_thread(self.store.heartbeat_host, self.host_id)
                await self._read_secrets()  # a rotated secret is taken within a beat
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

    def _from_thread(self, coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=300)

    async def run(self) -> None:
        """Serve until ``stopping`` is set (SIGTERM / SIGINT set it). Spaces stay up: an
        agent that restarts adopts them."""
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self._loop.add_signal_handler(sig, self.stopping.set)
        await self._register()
        await self._read_secrets()
        await self.sweep()  # adopt what an earlier run of this agent provided
        api = HostApiServer(self.address, _Service(self))
        api.start()
        log.info("host %s serving on %s (%s)", self.host_id, self.address, self.backend_name)
        try:
            await asyncio.gather(self._heartbeat(), self._sweeper())
        finally:
            api.close()
            for fwd in self._forwards.values():
                await fwd.close()
            await self.backend.close()
            self.store.close()


class _Service:
    """The API's view of the agent: calls arrive on the server's threads."""

    def __init__(self, agent: HostAgent) -> None:
        self._agent = agent

    def accepted_secrets(self) -> list[HostSecret]:
        return self._agent._secrets

    def place(self, space: str, generation: int) -> dict[str, Any]:
        return self._agent._from_thread(self._agent.place(space, generation))

    def rotate(self, space: str, generation: int, lease: int) -> dict[str, Any]:
        return self._agent._from_thread(self._agent.rotate(space, generation, lease))

    def status(self, space: str, generation: int) -> dict[str, Any]:
        return self._agent.status(space, generation)
