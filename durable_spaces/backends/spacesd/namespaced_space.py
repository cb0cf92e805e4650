"""The Space of a cua-spacesd daemon that runs on this host in its own PID namespace
(``backend.py`` starts it; ``daemon.py`` says why a namespace): its workspace is a
directory here, scanned here and kept by a change journal, and raising its epoch also
sweeps the processes the daemon does not track."""

from __future__ import annotations

import asyncio
import posixpath
from typing import Any

from durable_spaces.backends.local.journal import ChangeJournal
from durable_spaces.backends.spacesd.daemon import PIDNS, LocalDaemon
from durable_spaces.backends.spacesd.host_scan import HostScan, HostScannedSpace
from durable_spaces.backends.spacesd.procs import sweep_untracked
from durable_spaces.backends.spacesd.spacesd_space import SweepWhen
from durable_spaces.host.boot import read_host_boot_id
from durable_spaces.host.bounded import parse_json


class _Probe:
    """Tells the Space whether its daemon is up and whether the Space still exists."""

    def __init__(self, daemon: LocalDaemon, instance_id: str) -> None:
        self._daemon = daemon
        self._instance = instance_id

    def boot_id(self) -> str | None:
        return self._daemon.boot_id()

    def gone(self) -> bool:
        st = self._daemon.read_state()
        return st is None or st.instance_id != self._instance

    def namespace_pid(self) -> int:
        """Host pid of the daemon when it runs in its own namespaces (0: it shares ours)."""
        st = self._daemon.read_state()
        return st.daemon_pid if st is not None and st.isolation == PIDNS else 0


class NamespacedSpace(HostScannedSpace):
    """A Space whose daemon is pid 1 of its own PID namespace on this host: raising the
    epoch also sweeps processes the daemon does not track (orphans of older commands);
    its workspace is scanned here, kept by a change journal (module docstring)."""

    daemon_pid = 0

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        journal = self._journal if self.settings.space_journal else None
        self._host = HostScan(self.root, self.root, journal, self._up, stats=self._scans.stats)

    def _up(self) -> bool:
        return self._probe.boot_id() is not None

    def _journal(self, root: str) -> ChangeJournal:
        probe = self._probe
        boot = probe.boot_id()
        pid = probe.namespace_pid() if isinstance(probe, _Probe) else self.daemon_pid
        mountinfo = ["/proc/self/mountinfo"] + ([f"/proc/{pid}/mountinfo"] if pid else [])

        def guard() -> str | None:
            if boot is None or probe.boot_id() != boot:
                return "the Space's daemon started again"
            return None

        staging = posixpath.join(posixpath.dirname(root.rstrip("/")), ".ds-staging")
        return ChangeJournal(root, staging, guard, mountinfo)

    def workspace_journal(self) -> ChangeJournal | None:
        """A journal of the workspace of its own (``space.JournaledSpace``), for a
        checkpoint's walk; None when ``settings.space_journal`` is off or the daemon is down."""
        if not self.settings.space_journal or self._probe.boot_id() is None:
            return None
        return self._journal(self.root)

    async def host_boot_id(self) -> str | None:
        """The boot id of the host the daemon's data dir and workspace are on
        (``durable_spaces/host/boot.py``): a power loss drops their unsynced writes."""
        return read_host_boot_id(self.settings.host_boot_id)

    def _sweep_when(self) -> SweepWhen:
        # The process-group fallback has no sweep: the weaker, documented guarantee.
        return "always" if self.daemon_pid > 0 else "never"

    async def _sweep_strays(self) -> None:
        answer = await self._call("list_processes", False)
        procs = parse_json(answer or "[]", where="the daemon's process list")
        tracked = {int(p["pid"]) for p in procs if p.get("state") == "PROCESS_STATE_RUNNING"}
        await asyncio.to_thread(sweep_untracked, self.daemon_pid, tracked)
