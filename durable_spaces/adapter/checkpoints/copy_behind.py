"""The Space's copy of a checkpoint (``.ds-checkpoints``), written once the call it was
taken for is over, when a store already holds it durably (``incremental``).

Why: with a store, the copy beside the workspace is only a fast path (every restore, a
fork's first use and the checker read the store first), yet writing it (a file per new
blob, the manifest, their renames) was on the path of the call (its cost:
docs/performance.md). It now runs in a thread once the call's result is committed (``Behind``),
while the model thinks.

What it gives up: nothing a recovery needs. The next call's effect waits for the write
(``calls.py``), so a checkpoint that a recovery may restore (the one before a call whose
outcome is unknown) is in both copies before the Space changes again, as it was when
the copy was written on the call's path. A driver killed between the checkpoint and the
end of its copy's write had not changed the Space since: the checkpoint is the Space as
it is, and nothing restores it. The copy was never fsynced with a store (a power loss
could already leave it behind), and a copy that lacks a checkpoint or a blob is passed
over for the store's and mended after a restore; the next checkpoint's heal puts back
the blobs it needs.

Order: one write per Space at a time, and nothing else of the Space's copy in between:
the next effect on the Space, its next checkpoint, a prune, a restore and a read of the
copies all wait for it first (``settle``). A write that fails is a warning: the copy is
housekeeping. ``Settings.copy_behind`` off (``DS_COPY_BEHIND=0``) writes it on the call's
path again, to compare.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.batch import Batch
from durable_spaces.adapter.checkpoints.copy_watch import BlobNames
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.adapter.checkpoints.store import CheckpointStore, DirectoryCheckpointStore
from durable_spaces.adapter.checkpoints.workspace_tree import TreeChanged
from durable_spaces.adapter.image import blob_id

logger = logging.getLogger(__name__)

__all__ = ["Behind", "CopyWrite", "heal"]


@dataclass
class CopyWrite:
    """What one checkpoint adds to the Space's copy at ``directory``."""

    directory: str
    cid: CheckpointId
    data: bytes  # the manifest's bytes
    manifest: mf.Manifest
    need: set[str]  # every blob the manifest names
    #: sha -> the bytes, or (an int) the size of a blob to clone from the store's
    blobs: dict[str, bytes | int] = field(default_factory=dict)
    #: (uid, gid) every file and directory it makes must have (a container's user,
    #: which prunes the copy from inside); None: this process's.
    owner: tuple[int, int] | None = None
    #: The store's files made ahead again for the next checkpoint (``Batch.refill``):
    #: after the call, as this write, not beside its end.
    refill: Callable[[], None] | None = None
    #: Whether the copy's store makes files ahead (``Settings.inode_pool``).
    make_ahead: bool = True

    def write(self, store: CheckpointStore, names: BlobNames, read: Callable[[str], bytes]) -> None:
        """Write it (blobs first, the manifest last, not fsynced); ``names`` keeps the
        copy's blob names, ``read(path)`` a workspace file's bytes for a blob the store
        lacks."""
        if self.refill is not None:
            self.refill()
        copy = DirectoryCheckpointStore(
            self.directory, in_space=True, owner=self.owner, make_ahead=self.make_ahead
        )
        with copy.batch(sync=False) as cb:
            large = {s: n for s, n in self.blobs.items() if isinstance(n, int)}
            for blob in self.blobs.values():
                if isinstance(blob, bytes):
                    cb.add(blob)
            if large:
                with store.batch(sync=False) as sb:
                    for sha, size in large.items():
                        fd = sb.open_blob(sha)
                        try:
                            cb.add_from(fd, size)
                        finally:
                            os.close(fd)
            heal(store, self.manifest, self.need, names.names(cb.blobs_fd) | cb.added, cb, read)
            cb.manifest(self.cid, self.data)


def heal(
    store: CheckpointStore | None,
    m: mf.Manifest,
    need: set[str],
    present: set[str],
    cb: Batch,
    read: Callable[[str], bytes],
) -> None:
    """Put back into ``cb``'s directory the blobs ``m`` needs (``need``) that it lost: not
    ``present`` there (``copy_watch``) nor added by the batch. From the store where it
    has them intact, else from the workspace file (``read``), which must still hold them."""
    missing = need - present
    for path, e in m.items():
        if e.kind != mf.FILE or e.ref not in missing:
            continue
        data = store.get_blob(e.ref) if store is not None else None
        if data is None or blob_id(data) != e.ref:
            data = read(path)
        if blob_id(data) != e.ref:
            raise TreeChanged(f"{path!r} changed while its blob was put back")
        cb.add(data)
        missing.discard(e.ref)


class Behind:
    """The copy writes still running, one per Space (by name)."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[None]] = {}
        self._held: dict[str, Callable[[], None]] = {}

    def hold(self, space: str, job: Callable[[], None]) -> None:
        """Take ``job`` (the caller settled ``space`` first); it runs, in a thread, once
        ``release`` says the call is over (its result committed: ``calls.py`` asks for
        that through ``ToolContext.after_result``) or at the next ``settle``, whichever
        comes first. Why not at once: a copy running beside the rest of the call (the
        checkpoint's hand-back, its record in the result's commit) took their CPU and
        the GIL, and lengthened the call. After the result, it runs while
        the model thinks."""
        self._held[space] = job

    def release(self, space: str | None = None) -> None:
        """Start the held copy write of ``space`` (None: of every Space)."""
        for name in list(self._held) if space is None else [space]:
            job = self._held.pop(name, None)
            if job is None:
                continue

            def run(job: Callable[[], None] = job, name: str = name) -> None:
                try:
                    job()
                except Exception as e:  # housekeeping: the store holds the checkpoint
                    logger.warning("the copy in Space %s was not written: %s", name, e)

            self._running[name] = asyncio.get_running_loop().run_in_executor(None, run)

    async def settle(self, space: str | None = None) -> None:
        """Wait for the write of ``space`` (None: of every Space), started now if held."""
        self.release(space)
        loop = asyncio.get_running_loop()
        for name in list(self._running) if space is None else [space]:
            fut = self._running.get(name)
            if fut is None:
                continue
            try:
                if fut.get_loop() is loop:  # another loop's ended with it (executor joined)
                    with contextlib.suppress(Exception):
                        await asyncio.shield(fut)
            finally:
                if self._running.get(name) is fut:
                    del self._running[name]
