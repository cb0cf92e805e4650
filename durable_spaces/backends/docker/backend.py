"""Docker Spaces: one container per Space, the real cua-spacesd as its daemon.

The image (``make space-image``, see ``image``) runs ``cua-spacesd supervise`` as
pid 1, which serves the daemon as its child and reaps orphans. The adapter reaches the
daemon on a fixed loopback port (``127.0.0.1:<port>:3211``, chosen at create and kept in
the container's config and in ``<state_dir>/<name>/port``, so it survives restarts;
an ephemeral one would change). The client side is the spacesd backend's Space, pointed at
that port with the workspace ``/home/cua/work`` and the user ``cua``: one client for both.

Ownership: every container carries ``durable-spaces.owner=durable-spaces``, its Space name
and a hash of this backend's state directory; ``find``/``names``/``delete_all`` look only
at containers with all three, so nothing else on the engine is ever touched.

The token is a 0600 file under the state directory bind-mounted read-only at
``/run/cua/env-token``: never in the environment, labels, argv or logs (``docker inspect``
shows only the mount's host path).

Faults, as seen on Docker 20.10:

- ``restart``: ``docker kill`` + ``docker start``. The whole container dies, no command
  survives; finished ledger records and the epoch floor survive (the ledger lives in
  ``/var/lib/cua-spacesd`` inside the container), running ones read back ``LOST``.
  ``docker restart`` would wait out the daemon's shutdown grace (about 5 s) while a client
  holds an output stream; SIGKILL has no grace, so the streams are not detached and
  their waiters see ``SpaceUnavailableError``, as the contract asks (a detach would end
  them like an exit). While a stream is held, the new daemon's first /health answer
  waits for the SDK's reconnecting stream (detaching first avoided that, at that cost).
- ``kill_daemon``: SIGKILL of the daemon inside the container (pid 1 stays). ``supervise``
  starts a new daemon at once; the container does not exit. The command that was running
  SURVIVES as an orphan of pid 1 and its record reads ``LOST``. The daemon's own
  ``AdvanceEpoch`` only kills the processes it tracks, so it would miss that orphan (and
  any background process a command left behind); ``DockerSpace.advance_epoch`` therefore
  sweeps every process that is not under the current daemon when the floor rises.
- ``delete``: ``docker rm -f``. The ledger goes with the container: a Space created again
  under the name is a new instance (new ``instance_id``), empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_spaces.backends.docker.docker_space import ContainerProbe, DockerSpace
from durable_spaces.backends.docker.grant import take_back, write_token
from durable_spaces.backends.docker.host_view import WorkspaceView, merged_dir
from durable_spaces.backends.spacesd.machine import orphan_sweep_script, wait_http_health
from durable_spaces.errors import (
    BackendUnavailableError,
    SpaceError,
    SpaceGoneError,
    SpaceUnavailableError,
)
from durable_spaces.host.bounded import MAX_VALUE_BYTES, read_text
from durable_spaces.host.ports import free_port
from durable_spaces.settings import Settings

OWNER_LABEL = "durable-spaces.owner"
OWNER = "durable-spaces"
SPACE_LABEL = "durable-spaces.space"
INSTANCE_LABEL = "durable-spaces.instance"
STATE_LABEL = "durable-spaces.state"

DAEMON_PORT = 3211
ROOT = "/home/cua/work"
USER = "cua"
TOKEN_PATH = "/run/cua/env-token"

#: How long a container may take from start to the daemon's first answer.
BOOT_TIMEOUT = 30.0

_NAME_OK = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")

# Kills, as root inside the container, every process that is neither pid 1, nor under the
# current daemon, nor a `docker exec` session (those hang off pid 0). What remains of a
# killed daemon's commands and background leftovers of finished ones hang off pid 1.
_SWEEP = orphan_sweep_script("pgrep -P 1 -x cua-spacesd | head -n1")


def _not_found() -> type[Exception]:
    import docker.errors

    return docker.errors.NotFound


def _client() -> Any:
    import docker

    return docker.from_env(timeout=60)


def unavailable_reason(image: str | None = None) -> str | None:
    """None when docker Spaces can run here; otherwise why not (for a test skip)."""
    try:
        client = _client()
        client.ping()
    except Exception as e:  # the SDK raises several unrelated types here
        return f"Docker engine not running: {e}"
    try:
        from durable_spaces.backends.docker.image import image_tag  # the build's, on use

        tag = image or image_tag(Settings.from_env())  # the registry's call: an edge
        try:
            client.images.get(tag)
        except Exception:
            return f"space image {tag} not built: run make space-image"
    except Exception as e:
        return f"space image tag unknown: {e}"
    finally:
        client.close()
    return None


class DockerBackend:
    """Docker containers as Spaces. ``state_dir`` holds each Space's token and port."""

    kind = "container"

    def __init__(self, state_dir: str | os.PathLike[str], image: str | None = None,
                 settings: Settings | None = None) -> None:  # fmt: skip
        self.settings = Settings.from_env() if settings is None else settings
        self.state_dir = Path(state_dir).resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._image = image
        self._docker: Any = None
        self._state_hash = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:12]
        self._spaces: dict[str, DockerSpace] = {}
        #: Seconds from container (re)start to the daemon's first answer, last time.
        self.last_boot_seconds: float | None = None

    # --- engine -------------------------------------------------------------------------

    @property
    def image(self) -> str:
        if self._image is None:
            from durable_spaces.backends.docker.image import image_tag  # the build's, on use

            self._image = image_tag(self.settings)
        return self._image

    def engine(self) -> Any:
        """The Docker SDK client (``BackendUnavailableError`` when no engine runs)."""
        if self._docker is None:
            try:
                self._docker = _client()
                self._docker.ping()
            except Exception as e:
                self._docker = None
                raise BackendUnavailableError(f"Docker engine not running: {e}") from e
        return self._docker

    def container_name(self, name: str) -> str:
        return f"ds-{self._state_hash[:8]}-{name}"

    def _labels(self, name: str) -> dict[str, str]:
        return {OWNER_LABEL: OWNER, SPACE_LABEL: name, STATE_LABEL: self._state_hash}

    def _filters(self, name: str | None = None) -> dict[str, list[str]]:
        labels = [f"{OWNER_LABEL}={OWNER}", f"{STATE_LABEL}={self._state_hash}"]
        if name is not None:
            labels.append(f"{SPACE_LABEL}={name}")
        return {"label": labels}

    def _container(self, name: str) -> Any | None:
        found = self.engine().containers.list(all=True, filters=self._filters(name))
        if not found:
            return None
        if len(found) > 1:  # cannot happen through this class: names are unique
            raise SpaceError(f"{len(found)} containers claim Space {name!r}")
        return found[0]

    # --- files --------------------------------------------------------------------------

    def _home(self, name: str) -> Path:
        return self.state_dir / name

    def _sdk_home(self) -> str:
        """The cua SDK's own state (its sandbox registry), kept out of the user's ~/.cua."""
        home = self.state_dir / ".cua-sdk"
        home.mkdir(mode=0o700, exist_ok=True)
        return str(home)

    def _token_path(self, name: str) -> Path:
        return self._home(name) / "token"

    @contextlib.contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        """Serialize create/restart/delete of one name across processes."""
        fd = os.open(self.state_dir / f".{name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read_token(self, name: str) -> str:
        try:
            return read_text(self._token_path(name), max_bytes=MAX_VALUE_BYTES).strip()
        except FileNotFoundError as e:
            raise SpaceUnavailableError(
                f"Space {name!r}: its token file is gone from {self.state_dir}"
            ) from e

    def _stored_port(self, name: str) -> int | None:
        try:
            return int(read_text(self._home(name) / "port", max_bytes=MAX_VALUE_BYTES))
        except (FileNotFoundError, ValueError):
            return None

    @staticmethod
    def _published_port(container: Any) -> int:
        bindings = container.attrs["HostConfig"]["PortBindings"][f"{DAEMON_PORT}/tcp"]
        return int(bindings[0]["HostPort"])

    # --- lifecycle ------------------------------------------------------------------------

    def _create_sync(self, name: str) -> Any:
        """Create and start the container (caller holds the lock, checked it is absent)."""
        engine = self.engine()
        write_token(self._home(name))
        # Keep a previous instance's port when it is still free (stable for observers).
        port = self._stored_port(name) or free_port()
        labels = self._labels(name)
        labels[INSTANCE_LABEL] = uuid.uuid4().hex
        last: Exception | None = None
        for _ in range(5):
            try:
                c = engine.containers.create(
                    self.image,
                    name=self.container_name(name),
                    hostname=name[:63],
                    labels=labels,
                    ports={f"{DAEMON_PORT}/tcp": ("127.0.0.1", port)},
                    volumes={str(self._token_path(name)): {"bind": TOKEN_PATH, "mode": "ro"}},
                    detach=True,
                )
            except Exception as e:
                if "No such image" in str(e) or "not found" in str(e).lower():
                    raise BackendUnavailableError(
                        f"space image {self.image} not built: run make space-image"
                    ) from e
                raise
            try:
                c.start()
            except Exception as e:  # port taken by someone else meanwhile: pick another
                c.remove(force=True)
                if "port is already allocated" not in str(e) and "address already" not in str(e):
                    raise
                last = e
                port = free_port()
                continue
            (self._home(name) / "port").write_text(str(port))
            c.reload()
            return c
        raise SpaceUnavailableError(f"no free loopback port for Space {name!r}: {last}")

    async def create(self, name: str) -> DockerSpace:
        if not _NAME_OK.match(name):
            raise ValueError(f"invalid Space name {name!r} (want [a-z0-9-], <= 63 chars)")

        def sync() -> Any:
            with self._lock(name):
                c = self._container(name)
                if c is None:
                    c = self._create_sync(name)
                elif c.status != "running":
                    c.start()
                    c.reload()
                return c

        c = await asyncio.to_thread(sync)
        return await self._attach(name, c)

    async def find(self, name: str) -> DockerSpace | None:
        c = await asyncio.to_thread(self._container, name)
        if c is None:
            return None
        if c.status != "running":  # the machine is off (engine restart, crash): boot it
            try:
                await asyncio.to_thread(c.start)
                await asyncio.to_thread(c.reload)
            except _not_found():  # deleted meanwhile
                return None
            except Exception as e:
                if "marked for removal" in str(e):  # an `rm -f` is under way: it is gone
                    return None
                raise
        return await self._attach(name, c)

    async def _attach(self, name: str, c: Any) -> DockerSpace:
        """The Space of container ``c`` once its daemon answers (one object per instance)."""
        port = self._published_port(c)
        self.last_boot_seconds = await self._await_daemon(c)
        space = self._spaces.get(name)
        if space is not None and space.container_id == c.id and space.port == port:
            return space
        merged = merged_dir(c)  # where this host sees the container's files (host_view)
        space = DockerSpace(
            self,
            name=name,
            container_id=c.id,
            port=port,
            token=self._read_token(name),
            instance_id=c.labels[INSTANCE_LABEL],
            root=ROOT,
            user=USER,
            sdk_home=self._sdk_home(),
            view=WorkspaceView(merged, ROOT) if merged is not None else None,
            journal_dir=str(self._home(name) / "journal"),
            settings=self.settings,
        )
        await space.require_exec_ledger()
        self._spaces[name] = space
        return space

    async def _await_daemon(self, c: Any) -> float:
        """Seconds until container ``c``'s daemon answers its health check; gives up at
        once when the container is removed meanwhile (a removal racing a restart must not
        wait out the whole boot timeout; a restart racing this wait is waited for)."""
        removed = ContainerProbe(self, c.id).removed
        return await wait_http_health(self._published_port(c), BOOT_TIMEOUT, give_up=removed)

    def _require(self, name: str) -> Any:
        c = self._container(name)
        if c is None:
            raise SpaceGoneError(f"docker Space {name!r} does not exist")
        return c

    async def restart(self, name: str) -> None:
        """``docker kill`` + ``docker start``: SIGKILL, so no shutdown grace for a held
        output stream to stretch; the streams break and their waiters raise
        ``SpaceUnavailableError`` (what the contract asks), then the daemon answers."""

        def sync() -> Any:
            with self._lock(name):
                c = self._require(name)
                if c.status == "running":
                    with contextlib.suppress(Exception):
                        c.kill()
                c.wait(condition="not-running", timeout=30)
                c.start()
                c.reload()
                return c

        c = await asyncio.to_thread(sync)
        await self._await_daemon(c)

    async def rotate_token(self, name: str, max_epoch: int | None = None) -> str:
        """A new access token: written to the token file, then the container restarted,
        since a bind mount keeps the file it was started with (its processes die, as an
        epoch advance would have killed them). ``max_epoch``: a floor above it is taken
        back to it (``grant.py``). The floor is read once the old token is refused, after
        the restart: until then the superseded holder could still raise it."""
        self._spaces.pop(name, None)  # it holds the old token
        token = await asyncio.to_thread(write_token, self._home(name))
        await self.restart(name)
        space = await self.find(name) if max_epoch is not None else None
        if space is not None and max_epoch is not None and await space.current_epoch() > max_epoch:

            def locked() -> Any:
                with self._lock(name):
                    return take_back(self._require(name), max_epoch)

            self._spaces.pop(name, None)
            self.last_boot_seconds = await self._await_daemon(await asyncio.to_thread(locked))
        return token

    async def pause(self, name: str) -> None:
        """Freeze the container (``docker pause``: the cgroup freezer, daemon included)."""

        def sync() -> None:
            with self._lock(name):
                c = self._require(name)
                if c.status == "running":
                    c.pause()

        await asyncio.to_thread(sync)

    async def resume(self, name: str) -> None:
        def sync() -> None:
            with self._lock(name):
                c = self._container(name)
                if c is not None and c.status == "paused":
                    c.unpause()

        await asyncio.to_thread(sync)

    async def kill_daemon(self, name: str) -> None:
        """SIGKILL the daemon inside the container; ``supervise`` starts a new one.
        Commands survive as orphans until the next epoch raise (see the module doc)."""

        def kill() -> tuple[Any, int | None]:
            c = self._require(name)
            if c.status != "running":
                return c, None
            old = self._daemon_pid(c)
            if old is not None:
                r = c.exec_run(["kill", "-9", str(old)], user="root")
                if r.exit_code != 0:
                    raise SpaceError(f"could not kill the daemon of {name!r}: {r.output!r}")
            return c, old

        def back(c: Any, old: int | None) -> bool:
            """A new daemon runs (starting the container if it stopped)."""
            c.reload()
            if c.status != "running":
                c.start()
                c.reload()
                return True
            pid = self._daemon_pid(c)
            return pid is not None and pid != old

        c, old = await asyncio.to_thread(kill)
        deadline = time.monotonic() + BOOT_TIMEOUT
        while not await asyncio.to_thread(back, c, old):
            if time.monotonic() > deadline:
                raise SpaceUnavailableError(f"the daemon of {name!r} did not come back")
            await asyncio.sleep(0.02)
        self.last_boot_seconds = await self._await_daemon(c)

    @staticmethod
    def _daemon_pid(c: Any) -> int | None:
        r = c.exec_run(["pgrep", "-P", "1", "-x", "cua-spacesd"], user="root")
        out = r.output.decode().split()
        return int(out[0]) if r.exit_code == 0 and out else None

    async def sweep(self, name: str, container_id: str | None = None) -> None:
        """Kill every process of the Space that its current daemon does not own."""

        def sync() -> None:
            c = self._container(name)
            if c is None or (container_id is not None and c.id != container_id):
                raise SpaceGoneError(f"docker Space {name!r} does not exist")
            if c.status != "running":
                return
            r = c.exec_run(["sh", "-c", _SWEEP], user="root")
            if r.exit_code != 0:
                raise SpaceUnavailableError(
                    f"could not sweep stray processes of {name!r}: exit {r.exit_code}"
                )

        await asyncio.to_thread(sync)

    async def exists(self, name: str) -> bool:
        return await asyncio.to_thread(self._container, name) is not None

    async def delete(self, name: str) -> None:
        # The Space object stays usable for its holders: it reports SpaceGoneError, and a
        # command's waiter sees the stream break (never a detach that looks like an exit).
        self._spaces.pop(name, None)

        def sync() -> None:
            with self._lock(name):
                c = self._container(name)
                if c is not None:
                    with contextlib.suppress(_not_found()):  # removed meanwhile: fine
                        c.remove(force=True)
                tok = self._token_path(name)
                tok.unlink(missing_ok=True)

        await asyncio.to_thread(sync)

    async def names(self) -> list[str]:
        def sync() -> list[str]:
            cs = self.engine().containers.list(all=True, filters=self._filters())
            return sorted(c.labels[SPACE_LABEL] for c in cs)

        return await asyncio.to_thread(sync)

    async def delete_all(self) -> list[str]:
        """Remove every Space of this backend (its state directory's), nothing else."""
        gone = await self.names()
        for name in gone:
            await self.delete(name)
        return gone

    async def close(self) -> None:
        for space in self._spaces.values():
            with contextlib.suppress(Exception):
                await space.close()
        self._spaces.clear()
        if self._docker is not None:
            with contextlib.suppress(Exception):
                self._docker.close()
            self._docker = None


if TYPE_CHECKING:  # what mypy checks this backend against (durable_spaces.space)
    from durable_spaces.space import Faults, Space, SpaceBackend

    def _conforms(b: DockerBackend, s: DockerSpace) -> tuple[SpaceBackend, Faults, Space]:
        return b, b, s
