"""The client side of a docker Space: the spacesd backend's Space, plus what a container adds.

``SpacesdSpace`` already speaks to any cua-spacesd; here it only needs a ``DaemonProbe``
that knows containers, and two additions:

- file operations run as the Space's user (``cua``), like its commands. The daemon runs
  as root, so without this every file the adapter writes would be root's and a command
  could not change it (the conformance suite's scan test caught exactly that).
- ``advance_epoch`` also sweeps the container for processes the current daemon does not
  own. cua-spacesd's own AdvanceEpoch kills only the commands it tracks, so the orphans
  of a killed daemon (``supervise`` restarts the daemon but keeps them) and background
  leftovers of finished commands would otherwise outlive the floor they were started
  under.

The probe's ``boot_id`` is called around every output event, so it must be cheap: when the
engine runs on this host it reads the daemon's host pid from ``/proc`` (pid 1 of the
container is ``supervise``, the daemon its child); otherwise (a remote engine) it falls
back to the container's start time from the API, which misses a daemon-only restart.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import psutil

from durable_spaces.backends.spacesd.space import SpacesdSpace
from durable_spaces.errors import SpaceGoneError

if TYPE_CHECKING:
    from durable_spaces.backends.docker.backend import DockerBackend

#: Daemon file operations that take ``user=`` (``upload`` takes it in its options).
_FILE_OPS = frozenset({"download", "make_dir", "remove", "stat", "list_dir", "move_path"})


#: How often a wait for a daemon asks the engine whether its container was removed.
REMOVED_POLL = 0.25


class ContainerProbe:
    """``DaemonProbe`` for one container instance (its id changes when it is recreated)."""

    def __init__(self, backend: DockerBackend, container_id: str) -> None:
        self._backend = backend
        self._id = container_id
        self._init: psutil.Process | None = None
        self._init_start = 0.0
        self._remote_started: str | None = None
        self._gone = False  # once gone, always gone: the id is never reused
        self._removed_asked = 0.0

    def _inspect(self) -> dict[str, Any] | None:
        try:
            c = self._backend._engine().containers.get(self._id)
        except Exception as e:
            if type(e).__name__ == "NotFound":
                return None
            raise
        return dict(c.attrs["State"])

    def _refresh_init(self) -> bool:
        """Find pid 1 of the container on this host; False when it is not running."""
        state = self._inspect()
        if state is None or not state.get("Running"):
            self._init = None
            return False
        pid = int(state.get("Pid") or 0)
        self._remote_started = str(state.get("StartedAt"))
        try:
            p = psutil.Process(pid)
            self._init, self._init_start = p, p.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._init = None  # a remote engine: the pid is not ours to see
        return True

    def _init_alive(self) -> bool:
        p = self._init
        if p is None:
            return False
        try:
            return p.create_time() == self._init_start and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def boot_id(self) -> str | None:
        try:
            if not self._init_alive() and not self._refresh_init():
                return None
        except Exception:  # the engine does not answer: treat the daemon as down
            return None
        if self._init is None:
            return f"started:{self._remote_started}"
        try:
            for child in self._init.children():
                if child.name() == "cua-spacesd" and child.status() != psutil.STATUS_ZOMBIE:
                    return f"{child.pid}:{child.create_time()}"
        except psutil.NoSuchProcess:
            pass
        return None

    def removed(self) -> str | None:
        """Why a wait for the daemon should stop now: the container was removed (or is
        being removed). One merely stopped is waited for: someone may be restarting it.
        Asks the engine at most every ``REMOVED_POLL`` seconds."""
        now = time.monotonic()
        if now - self._removed_asked < REMOVED_POLL:
            return None
        self._removed_asked = now
        try:
            state = self._inspect()
        except Exception:
            return None  # the engine cannot tell: keep waiting
        if state is None or state.get("Status") in ("removing", "dead"):
            return "the container was removed before its daemon answered"
        return None

    def gone(self) -> bool:
        """Asked on error paths and before connecting, so one engine request is cheap."""
        if not self._gone:
            try:
                self._gone = self._inspect() is None
            except Exception:
                return False  # the engine cannot tell: unavailable, not gone
        return self._gone


class DockerSpace(SpacesdSpace):
    """A cua-spacesd Space inside a container, reached on its published loopback port."""

    def __init__(
        self,
        backend: DockerBackend,
        *,
        name: str,
        container_id: str,
        port: int,
        token: str,
        instance_id: str,
        root: str,
        user: str,
        sdk_home: str | None = None,
    ) -> None:
        super().__init__(
            name,
            root,
            instance_id,
            f"http://127.0.0.1:{port}",
            token,
            ContainerProbe(backend, container_id),
            kind="container",
            user=user,
            sdk_home=sdk_home,
        )
        self._backend = backend
        self.container_id = container_id
        self.port = port

    def __repr__(self) -> str:  # never shows the token
        return f"DockerSpace({self.name!r}, port={self.port})"

    async def _call(self, method: str, *args: Any, **kw: Any) -> Any:
        if self._user is not None:
            if method in _FILE_OPS:
                kw.setdefault("user", self._user)
            elif method == "upload" and len(args) >= 3 and args[2] is not None:
                args[2].user = self._user
        return await super()._call(method, *args, **kw)

    async def advance_epoch(self, epoch: int) -> None:
        before = await self.current_epoch()
        await super().advance_epoch(epoch)
        if epoch > before:
            try:
                await self._backend.sweep(self.name, self.container_id)
            except SpaceGoneError:
                raise
            except Exception as e:
                raise self._down(f"sweeping stray processes failed: {e}") from None
