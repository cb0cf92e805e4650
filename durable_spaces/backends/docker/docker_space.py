"""The client side of a docker Space: the spacesd backend's Space, plus what a container adds.

``SpacesdSpace`` already speaks to any cua-spacesd; here it only needs a ``DaemonProbe``
that knows containers, the Space's user (``cua``: the daemon runs as root, so without it
every file the adapter writes would be root's and a command could not change it; the
conformance suite's scan test caught exactly that), and its sweep hook: when the floor
rises, the container is swept of processes the current daemon does not own.
cua-spacesd's own AdvanceEpoch kills only the commands it tracks, so the orphans of a
killed daemon (``supervise`` restarts the daemon but keeps them) and background
leftovers of finished commands would otherwise outlive the floor they were started
under.

The probe's ``boot_id`` is called around every output event, so it must be cheap: when the
engine runs on this host it reads the daemon's host pid from ``/proc`` (pid 1 of the
container is ``supervise``, the daemon its child); otherwise (a remote engine) it falls
back to the container's start time from the API, which misses a daemon-only restart.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import psutil

from durable_spaces.backends.docker.host_view import WorkspaceView
from durable_spaces.backends.local.journal import ChangeJournal, MountTable
from durable_spaces.backends.spacesd.host_scan import HostScan, HostScannedSpace
from durable_spaces.backends.spacesd.spacesd_space import SweepWhen
from durable_spaces.host.proc_start import started
from durable_spaces.settings import DEFAULTS, Settings

#: How often a wait for a daemon asks the engine whether its container was removed.
REMOVED_POLL = 0.25


class Containers(Protocol):
    """What a docker Space asks of its backend (``DockerBackend``)."""

    def engine(self) -> Any:
        """The Docker SDK client."""
        ...

    async def sweep(self, name: str, container_id: str | None = None) -> None:
        """Kill every process of the Space that its current daemon does not own."""
        ...


class ContainerProbe:
    """``DaemonProbe`` for one container instance (its id changes when it is recreated)."""

    def __init__(self, backend: Containers, container_id: str) -> None:
        self._backend = backend
        self._id = container_id
        self._init: psutil.Process | None = None
        self._init_start = 0.0
        self._remote_started: str | None = None
        self._gone = False  # once gone, always gone: the id is never reused
        self._removed_asked = 0.0

    def _inspect(self) -> dict[str, Any] | None:
        try:
            c = self._backend.engine().containers.get(self._id)
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
            self._init, self._init_start = p, started(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._init = None  # a remote engine: the pid is not ours to see
        return True

    def _init_alive(self) -> bool:
        p = self._init
        if p is None:
            return False
        try:
            return started(p.pid) == self._init_start and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def init_pid(self) -> int | None:
        """The host pid of the container's pid 1 while it runs and this host sees it."""
        return self._init.pid if self._init_alive() and self._init is not None else None

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
                    return f"{child.pid}:{started(child.pid)}"
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


class DockerSpace(HostScannedSpace):
    """A cua-spacesd Space inside a container, reached on its published loopback port;
    scanned on this host through the container's root filesystem where it can be
    (``view``, ``host_view``), with the journal's sentinel in ``journal_dir``."""

    def __init__(
        self,
        backend: Containers,
        *,
        name: str,
        container_id: str,
        port: int,
        token: str,
        instance_id: str,
        root: str,
        user: str,
        sdk_home: str | None = None,
        view: WorkspaceView | None = None,
        journal_dir: str | None = None,
        settings: Settings = DEFAULTS,
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
            settings=settings,
        )
        self._backend = backend
        self.container_id = container_id
        self.port = port
        self._view = view
        self._journal_dir = journal_dir
        if view is not None and journal_dir is not None:
            journal = self._journal if settings.space_journal else None
            self._host = HostScan(
                root, "", journal, self._up, self._scans.stats, resolve_root=view.resolve
            )

    def _up(self) -> bool:
        """The daemon answers and this host sees its container's mount table."""
        probe = self._probe
        assert isinstance(probe, ContainerProbe)
        return probe.boot_id() is not None and probe.init_pid() is not None

    def _journal(self, root: str) -> ChangeJournal:
        assert self._view is not None
        return self.journal_of(self._view, root)

    def journal_of(self, view: WorkspaceView, root: str) -> ChangeJournal:
        """A journal of the workspace as this host sees it (``root``, ``view``'s), trusted
        while the container's daemon is the one it started with, the workspace's path
        names the directory ``view`` holds, and no mount appears at or under the
        workspace, here or in the container (``host_view``)."""
        probe = self._probe
        assert isinstance(probe, ContainerProbe) and self._journal_dir is not None
        boot, pid = probe.boot_id(), probe.init_pid()
        tables: list[MountTable] = ["/proc/self/mountinfo"]
        if pid is not None:
            tables.append((f"/proc/{pid}/mountinfo", self.root))

        def guard() -> str | None:
            if boot is None or pid is None or probe.boot_id() != boot:
                return "the container or its daemon started again"
            return view.moved()

        return ChangeJournal(root, self._journal_dir, guard, tables)

    def host_view(self) -> ContainerView | None:
        """``space.ViewedSpace``: a view of its own for a checkpoint's walk (a descriptor of
        its own: the scans' view opens the workspace again on its own schedule)."""
        if self._view is None or self._journal_dir is None or not self._up():
            return None
        return ContainerView(self, WorkspaceView(self._view.merged, self.root))

    async def close(self) -> None:
        await super().close()
        if self._view is not None:
            self._view.close()

    def __repr__(self) -> str:  # never shows the token
        return f"DockerSpace({self.name!r}, port={self.port})"

    def _sweep_when(self) -> SweepWhen:
        return "rise"

    async def _sweep_strays(self) -> None:
        await self._backend.sweep(self.name, self.container_id)


class ContainerView:
    """``space.HostView`` of a docker Space (``DockerSpace.host_view``)."""

    def __init__(self, space: DockerSpace, view: WorkspaceView) -> None:
        self._space = space
        self._view = view

    def open(self) -> str:
        if not self._space._up():
            raise OSError(2, "the container's daemon is down, or its files are not seen here")
        return self._view.resolve()

    def journal(self, root: str) -> ChangeJournal | None:
        on = self._space.settings.space_journal
        return self._space.journal_of(self._view, root) if on else None

    def copy_at(self, directory: str) -> tuple[str, tuple[int, int]] | None:
        return self._view.beside(directory)

    def close(self) -> None:
        self._view.close()
