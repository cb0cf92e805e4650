"""The scan of a daemon's Space whose workspace this host can see, kept by a change
journal (``local.journaled.JournaledScanner``), and the file reads it answers from what
it read. Shared by the Spaces whose daemon runs elsewhere than the scan: a ``spacesd``
daemon in its own namespaces on this host (``backend.NamespacedSpace``) and a container's
(``docker.space.DockerSpace``, its workspace seen through the container's root
filesystem, ``docker.host_view``).

Why: through the daemon a scan is one ``find`` of the whole workspace plus one
``sha256sum``, and a read of the changed files one more command, two scans a
transactional call (docs/performance.md). Here a scan costs what
the journal names, and the image's reads cost nothing (the scan kept the bytes).

Every answer is the one a scan through the daemon would give, or None: then the caller
asks the daemon (the daemon is down, the journal is off or cannot start, the workspace
cannot be found here). The journal trusts nothing across a new start of the daemon or
a new epoch (``reset``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

from durable_spaces.backends.local.journal import ChangeJournal
from durable_spaces.backends.local.journaled import JournaledScanner, small_if_free
from durable_spaces.backends.spacesd.spacesd_space import SpacesdSpace
from durable_spaces.space import PathTable, confine

__all__ = ["HostScan", "HostScannedSpace"]


class HostScan:
    """One Space's host-side scanner (module doc). ``space_root`` is the workspace as
    the daemon names it (what callers' paths are confined to); ``root`` as this host
    does (or ``resolve_root`` finds it before each full scan); ``up`` says whether the
    daemon answers (its workspace is then the one it serves)."""

    def __init__(
        self,
        space_root: str,
        root: str,
        make_journal: Callable[[str], ChangeJournal] | None,
        up: Callable[[], bool],
        stats: dict[str, int],
        resolve_root: Callable[[], str] | None = None,
    ) -> None:
        self.space_root = space_root
        self._up = up
        self._lock = threading.Lock()
        self.scanner = JournaledScanner(
            root, make_journal, host_fallback=False, stats=stats, resolve_root=resolve_root
        )

    def _scan(self, path: str, exclude: list[str]) -> PathTable | None:
        if not self._up():
            return None  # the daemon is down: the Space answers as it does
        with self._lock:
            return self.scanner.scan(path, exclude)

    async def scan(self, root: str, exclude: Sequence[str]) -> PathTable | None:
        """The table a scan through the daemon would give, or None (module doc). Paths
        are workspace-relative here, whatever the caller gave (``space_root``'s)."""
        path = confine(self.space_root, root)
        excl = [confine(self.space_root, e) for e in exclude]
        table = None
        if self._up():  # the journal's answer right here when it is small work
            table = small_if_free(self._lock, self.scanner, path, excl)
        if table is None:
            table = await asyncio.to_thread(self._scan, path, excl)
        return table

    def _kept(self) -> dict[str, bytes]:
        with self._lock:
            return self.scanner.kept

    async def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """What the last scan read of ``paths`` (those it did not read are left out)."""
        if self._lock.acquire(blocking=False):  # a dict: no thread hand-off for it
            try:
                kept = self.scanner.kept
            finally:
                self._lock.release()
        else:
            kept = await asyncio.to_thread(self._kept)
        out = {}
        for p in paths:
            rel = confine(self.space_root, p)
            if rel in kept:
                out[p] = kept[rel]
        return out

    def _reset(self, why: str) -> None:
        with self._lock:
            self.scanner.reset(why)

    async def reset(self, why: str) -> None:
        """Trust nothing seen so far (a new epoch, the Space closed)."""
        await asyncio.to_thread(self._reset, why)


class HostScannedSpace(SpacesdSpace):
    """A daemon's Space that scans here when its ``_host`` can (set by the subclass once
    it knows where this host sees the workspace), and through the daemon otherwise."""

    _host: HostScan | None = None

    @property
    def _here(self) -> HostScan | None:
        """``Settings.host_scan``: on, a Space whose workspace this host sees is scanned
        here; off, through its daemon (the journal in the Space, as a microvm's: to
        compare, and to run that path on a Space of this host)."""
        return self._host if self.settings.host_scan else None

    async def scan(self, root: str = ".", exclude: Sequence[str] = ()) -> PathTable:
        host = self._here
        table = await host.scan(root, exclude) if host is not None else None
        return table if table is not None else await super().scan(root, exclude)

    async def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        host = self._here
        out = await host.read_files(paths) if host is not None else {}
        rest = [p for p in paths if p not in out]
        if rest:
            out.update(await super().read_files(rest))
        return out

    async def advance_epoch(self, epoch: int) -> None:
        await super().advance_epoch(epoch)
        if self._host is not None:
            await self._host.reset("a new epoch")

    async def close(self) -> None:
        if self._host is not None:
            await self._host.reset("closed")
        await super().close()
