"""Checkpoints of a Space: of its workspace (``WorkspaceSnapshots``) or of the whole
machine (``SandboxSnapshots``).

A workspace checkpoint is incremental (``incremental``): a manifest of the workspace's
files, directories and symlinks (``manifest``) plus the blobs of the files no earlier
checkpoint stored, content-addressed; its id records the manifest's sha256
(``checkpoints.ids.CheckpointId``). It is kept beside the workspace in the Space
(``.ds-checkpoints``, not in the workspace) and, with a ``CheckpointStore``, also outside
the Space, so a lost Space can be rebuilt from the newest one on this machine or
another. Checkpoints older adapters took (one tar each) are still restored.

Restores never trust a copy (``checkpoints.copies``): the manifest must match the id's
digest and parse strictly, every blob must hash to its name, and the tar built from them
(or an old checkpoint's tar, matching its digest) must pass ``check_archive`` before
``tar -x`` runs into a staging directory beside the workspace and the result is swapped
in. A bad copy (tampered, torn, missing a blob, a symlink planted in its place, refused)
is passed over for the next one; when none is intact the restore fails with
``CheckpointCorruptError`` (permanent) naming the checkpoint, never a tool error.

A machine checkpoint (microVM) holds memory and disk; it lives with the backend.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterable, Callable
from typing import Protocol

from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints import space_copy
from durable_spaces.adapter.checkpoints.archive import archive_problem, check_archive
from durable_spaces.adapter.checkpoints.copies import (
    CheckpointMissing,
    CommandCopy,
    Copies,
    Copy,
    HostCopy,
    Loaded,
    StoreCopy,
)
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.adapter.checkpoints.incremental import Taker, copy_dir
from durable_spaces.adapter.checkpoints.store import CheckpointStore, DirectoryCheckpointStore
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import (
    CheckpointCorruptError,
    ConfigError,
    SpaceError,
    SpaceGoneError,
    SpaceUnavailableError,
)
from durable_spaces.settings import Settings
from durable_spaces.settings import of as settings_of
from durable_spaces.space import MachineCheckpoints, Space, SpaceBackend

logger = logging.getLogger(__name__)


__all__ = [
    "CheckpointMissing",
    "CheckpointStore",
    "DirectoryCheckpointStore",
    "SandboxSnapshots",
    "Snapshots",
    "WorkspaceSnapshots",
    "archive_problem",
    "check_archive",
]


class Snapshots(Protocol):
    """What a mode needs from a checkpoint provider."""

    whole_machine: bool

    async def checkpoint(self, space: Space, call_id: str, epoch: int) -> str: ...

    async def restore(
        self, space: Space, checkpoint_id: str, epoch: int, source: Space | None = None
    ) -> Space:
        """Make the Space equal to the checkpoint; returns the Space to use afterwards
        (a machine restore replaces it). Raises ``CheckpointMissing`` if it is gone,
        ``CheckpointCorruptError`` if no copy of it is intact."""
        ...

    def can_rebuild(self) -> bool:
        """Whether a checkpoint survives the loss of its Space."""
        ...


class WorkspaceSnapshots:
    """Incremental checkpoints of one directory tree (the workspace), module doc.

    Only regular files, directories and symlinks are captured (hard links as such):
    FIFOs, sockets and device nodes in the workspace are left out (transactional mode
    does not track them either), so none of them can make a later restore fail, and no
    checkpoint ever opens one."""

    whole_machine = False

    def __init__(
        self,
        spaces: SpaceBackend | None = None,
        root: str | None = None,
        store: CheckpointStore | None = None,
        prune_every: int = 8,
        backlog: int = 32,
        backlog_bytes: int = 8 << 20,
        settings: Settings | None = None,
    ) -> None:
        """``settings``: the product's (``durable_spaces/settings.py``); by default the
        backend's, else read from the environment now."""
        self.spaces = spaces
        self.settings = settings_of(settings, spaces)
        self.root = root
        self.store = store
        #: With a store, the copies inside the Space are only a fast path for recovery:
        #: every ``prune_every``-th prune call deletes the ones the log no longer records
        #: and the blobs only those named (one command; 0: never). Without a store they
        #: are the only copies (review and forks read them), so they are all kept.
        self.prune_every = prune_every
        #: When this host lists the copy (``host_garbage``), the prune's command (a
        #: fenced exec, most of a prune's cost) runs only once the copy holds
        #: ``backlog`` checkpoints the log does not record, or ``backlog_bytes`` of
        #: them and of blobs only they name, or a killed driver's leftovers; until then
        #: the garbage is only counted. Through commands every prune runs it.
        self.backlog = backlog
        self.backlog_bytes = backlog_bytes
        self._prune_calls: dict[str, int] = {}
        #: The blobs each manifest names (an id always names the same bytes), so a prune
        #: reads each recorded manifest once per process, not once per prune.
        self._needs: dict[str, frozenset[str]] = {}
        self.taker = Taker(store, self._needs, self.settings)  # fills ``_needs`` as it takes

    def can_rebuild(self) -> bool:
        return self.store is not None

    async def checkpoint(self, space: Space, call_id: str, epoch: int) -> str:
        return await self.taker.checkpoint(space, call_id, epoch)

    def release(self, space: str | None = None) -> None:
        """Start writing the Space's copy of the checkpoints taken (``copy_behind``):
        the call they were taken for is over."""
        self.taker.behind.release(space)

    async def settle(self, space: str | None = None) -> None:
        """Wait until the Space's (None: every Space's) copy of the checkpoints taken is
        written (with a store, it is written once each checkpoint's call is over:
        ``copy_behind``); one still held is started now."""
        await self.taker.behind.settle(space)

    # --- pruning the Space's copies ---------------------------------------------------

    async def prune(self, space: Space, recorded: Callable[[], set[str]], epoch: int) -> list[str]:
        """Delete the Space's copies of checkpoints the log no longer records, the blobs
        none of the recorded ones names, and what killed drivers left half-way, when a
        store holds every checkpoint anyway. ``recorded()`` is only asked when this call
        prunes. Blobs are kept whole when a recorded manifest cannot be read."""
        if self.store is None or not self.prune_every:
            return []
        n = self._prune_calls[space.name] = self._prune_calls.get(space.name, 0) + 1
        if n % self.prune_every:
            return []
        await self.taker.behind.settle(space.name)  # its copy's last write, first
        keep = {CheckpointId.parse(c) for c in recorded()}
        keep = {c for c in keep if c.kind == "workspace"}
        needed: set[str] | None = set()
        for cid in sorted(keep):
            if cid.form != "manifest" or needed is None:
                continue
            blobs = self._needs.get(cid)
            if blobs is None:
                try:
                    m = await Copies(cid).manifest(self._copies(space, epoch))
                except (CheckpointMissing, CheckpointCorruptError, SpaceError) as e:
                    if isinstance(e, SpaceUnavailableError):
                        raise
                    logger.warning("pruning %s keeps every blob: %s", space.name, e)
                    needed = None
                    continue
                blobs = self._needs[cid] = frozenset(mf.blobs(m))
            needed |= blobs
        present = None
        if await self.taker.is_host(space, epoch):
            garbage = host_garbage(copy_dir(space), keep, needed)
            if garbage is not None and not self._due(*garbage):
                return []
            if needed is not None:
                present = host_blobs(copy_dir(space))
        return await space_copy.prune(space, copy_dir(space), keep, needed, epoch, present)

    def _due(self, count: int, size: int) -> bool:
        return count >= self.backlog or size >= self.backlog_bytes

    # --- reading and restoring ------------------------------------------------------------

    def _copies(
        self,
        space: Space | None,
        epoch: int | None,
        *,
        host: bool = False,
        source: Space | None = None,
    ) -> list[Copy]:
        out: list[Copy] = [StoreCopy(self.store)] if self.store is not None else []
        if space is not None:
            if host:
                out.append(HostCopy(space, copy_dir(space)))
            else:
                out.append(CommandCopy("space", space, copy_dir(space), epoch))
        if source is not None:
            out.append(CommandCopy("parent", source, copy_dir(source), None))
        return out

    async def read_intact(self, checkpoint_id: str, spaces: AsyncIterable[Space]) -> bytes:
        """The workspace of a checkpoint as a tar, from its first intact copy: the
        store's, then each Space's (read at its own floor; the Spaces are only looked
        for when the store has no intact copy). Raises ``CheckpointMissing`` /
        ``CheckpointCorruptError``."""
        cid = CheckpointId.parse(checkpoint_id, "the checkpoint to read", "workspace")
        copies = Copies(cid)
        tries = self._copies(None, None)
        if tries:
            with contextlib.suppress(CheckpointMissing, CheckpointCorruptError):
                return (await copies.load(tries)).tar
        await self.taker.behind.settle()  # the Spaces' copies as this process wrote them
        async for sp in spaces:
            tries.append(CommandCopy(f"space {sp.name}", sp, copy_dir(sp), None))
        return (await copies.load(tries, skip={"store"})).tar

    async def contents(
        self, space: Space, checkpoint_id: str, epoch: int, source: Space | None = None
    ) -> dict[str, tuple[str, str | None]] | None:
        """What each path of the checkpoint's workspace holds (``manifest.contents``),
        from its manifest's first intact copy, as ``restore`` finds it; None for a tar
        checkpoint (an older adapter's), which is not read for this."""
        cid = CheckpointId.parse(checkpoint_id, "the checkpoint to restore", "workspace")
        if cid.form != "manifest":
            return None
        await self.taker.behind.settle(space.name)
        host = await self.taker.is_host(space, epoch)
        m = await Copies(cid).manifest(self._copies(space, epoch, host=host, source=source))
        return mf.contents(m)

    async def restore(
        self, space: Space, checkpoint_id: str, epoch: int, source: Space | None = None
    ) -> Space:
        """Restore the first intact copy: the store's, the one in the Space, then (a
        fork's first use) the parent Space's, read at the parent's own floor (module
        doc); only then is the workspace replaced. A bad copy is reported (a warning
        naming it) and mended from the intact one."""
        cid = CheckpointId.parse(checkpoint_id, "the checkpoint to restore", "workspace")
        await self.taker.behind.settle(space.name)  # no copy write under the restore
        if source is not None:
            await self.taker.behind.settle(source.name)
        host = await self.taker.is_host(space, epoch)
        tries = self._copies(space, epoch, host=host, source=source)
        copies = Copies(cid)
        failed: set[str] = set()
        while True:
            loaded = await copies.load(tries, skip=failed)  # raises when nothing is left
            hit("snapshots.restore")  # a restore paused here must never land after a takeover
            why = await space_copy.extract(space, copy_dir(space), cid, loaded.tar, epoch)
            if why is None:
                break
            copies.refuse(loaded.won, tries_where(tries, loaded.won, cid), f"tar -x failed: {why}")
            failed.add(loaded.won)
        self.taker.forget(space)
        await self._mend(cid, copies, loaded, tries)
        return space

    async def _mend(
        self, cid: CheckpointId, copies: Copies, loaded: Loaded, tries: list[Copy]
    ) -> None:
        """After a restore: rewrite a bad store copy, and keep a copy in the Space when
        its own was bad or the checkpoint came from the parent (so this Space's own
        recovery can restore it too). Housekeeping: failures only warn, except the
        Space failing to keep what only its parent had."""
        from_parent = "parent" in loaded.used

        def want(copy: Copy) -> bool:
            if copy.key == "store":
                return "store" in copies.bad or "store" in copies.lacks
            if copy.key == "space":
                return "space" in copies.bad or from_parent or bool(copies.lacks.get("space"))
            return False

        try:
            await copies.mend(loaded, tries, want)
        except SpaceError as e:
            if from_parent or isinstance(e, SpaceUnavailableError):
                raise
            logger.warning("could not rewrite the copy of %s in the Space: %s", cid, e)


def tries_where(tries: list[Copy], key: str, cid: CheckpointId) -> str:
    return next(c.where(cid) for c in tries if c.key == key)


class SandboxSnapshots:
    """Whole-machine checkpoints (memory and disk) taken by the backend (microVM).

    Checkpoints live with the backend on this machine; another machine needs
    ``WorkspaceSnapshots`` with a shared store. The backend must have
    ``MachineCheckpoints`` (``ConfigError`` otherwise).
    """

    whole_machine = True

    def __init__(self, backend: SpaceBackend) -> None:
        if not isinstance(backend, MachineCheckpoints):
            raise ConfigError(
                f"the {backend.kind!r} backend takes no machine checkpoints "
                "(MachineCheckpoints): use workspace snapshots with it"
            )
        self.backend: SpaceBackend = backend
        self.machines: MachineCheckpoints = backend

    def can_rebuild(self) -> bool:
        return True  # the checkpoint lives with the backend, outside the Space

    async def checkpoint(self, space: Space, call_id: str, epoch: int) -> str:
        cid = await self.machines.checkpoint(space.name, epoch)
        return CheckpointId.parse(cid, f"the backend's checkpoint of {space.name}", "machine")

    async def restore(
        self, space: Space, checkpoint_id: str, epoch: int, source: Space | None = None
    ) -> Space:
        cid = CheckpointId.parse(checkpoint_id, "the machine checkpoint to restore", "machine")
        hit("snapshots.restore")
        # Fenced by the backend against its host floor; the restored guest is raised to
        # that floor before anyone else can reach it.
        await self.machines.restore(space.name, cid, epoch)
        new = await self.backend.find(space.name)
        if new is None:
            # Removed while it was being restored: a lost Space (the next drive places it
            # again from the checkpoint), not a missing checkpoint.
            raise SpaceGoneError(f"Space {space.name} vanished while {cid} was restored")
        # The restored daemon has the checkpoint's older floor: raise it before anything.
        await new.advance_epoch(epoch)
        return new

    async def prune(self, space: Space, recorded: Callable[[], set[str]], epoch: int) -> list[str]:
        """Delete the Space's checkpoints that no recorded checkpoint refers to: a machine
        checkpoint holds the guest's memory (tens of MB), so unreferenced ones must go.
        ``recorded()`` is every checkpoint the log still names, forks included."""
        return await self.machines.prune_space(space.name, recorded())


#: Names in the copy only a driver killed half-way leaves (``space_copy.prune``).
_LEFTOVER = (".restore-", ".tmp-", ".probe-", ".pending-")


def host_garbage(
    d: str, keep: set[CheckpointId], needed: set[str] | None
) -> tuple[int, int] | None:
    """What a prune of the copy at ``d`` would delete, as this host lists it: (the
    checkpoints not in ``keep``, the bytes of those and of the blobs outside
    ``needed``). None when a prune must run anyway: a leftover of a killed driver, a
    blobs directory that is not one, anything unreadable. Only ever a reason to prune
    later, never to keep something: the prune itself decides what goes."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(d, flags)
    except FileNotFoundError:
        return 0, 0  # nothing kept here yet
    except OSError:
        return None
    try:
        kept = {c + c.suffix for c in keep}
        count = size = 0
        for name in os.listdir(fd):
            if name.startswith(_LEFTOVER):
                return None
            if name.endswith((".manifest", ".tar")) and name not in kept:
                count += 1
                size += os.lstat(name, dir_fd=fd).st_size
        if needed is not None and name_exists("blobs", fd):
            bfd = os.open("blobs", flags, dir_fd=fd)
            try:
                for name in set(os.listdir(bfd)) - needed:
                    if mf.BLOB_NAME.fullmatch(name):  # the only names a prune deletes
                        size += os.lstat(name, dir_fd=bfd).st_size
            finally:
                os.close(bfd)
        return count, size
    except OSError:  # changed under the listing, or planted: let the prune see
        return None
    finally:
        os.close(fd)


def name_exists(name: str, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def host_blobs(d: str) -> list[str] | None:
    """The names in ``d/blobs`` as this host lists them (None: not a directory here),
    neither followed through a symlink: a prune deletes only unneeded names from it."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(d, flags)
    except OSError:
        return None
    try:
        bfd = os.open("blobs", flags, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return os.listdir(bfd)
    except OSError:
        return None
    finally:
        os.close(bfd)
