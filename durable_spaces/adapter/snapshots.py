"""Checkpoints of a Space: of its workspace (``WorkspaceSnapshots``) or of the whole
machine (``SandboxSnapshots``).

A workspace checkpoint is a tar of the workspace taken through the Space's daemon. It is
kept inside the Space (beside the workspace, not in it) and, with a ``CheckpointStore``,
also outside the Space, so a lost Space can be rebuilt from the newest one on this
machine or another. Restores never trust the archive: every member is checked (no
absolute names, no ``..``, nothing under a symlink member, no links out, no devices)
before ``tar -x`` runs, into an emptied workspace.

A machine checkpoint (microVM) holds memory and disk; it lives with the backend.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from durable_spaces.adapter.space import Space, SpaceBackend
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import PathEscapeError, SpaceError, SpaceGoneError


@runtime_checkable
class CheckpointStore(Protocol):
    """Checkpoints kept outside any Space, keyed by id. Writes are atomic and immutable."""

    def put(self, checkpoint_id: str, data: bytes) -> None: ...

    def get(self, checkpoint_id: str) -> bytes | None: ...

    def delete(self, checkpoint_id: str) -> None: ...


class DirectoryCheckpointStore:
    """A directory (local or shared) of ``<id>.tar`` files, written tmp + fsync + rename."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _path(self, checkpoint_id: str) -> Path:
        if "/" in checkpoint_id or checkpoint_id.startswith("."):
            raise ValueError(f"bad checkpoint id {checkpoint_id!r}")
        return self.dir / f"{checkpoint_id}.tar"

    def put(self, checkpoint_id: str, data: bytes) -> None:
        path = self._path(checkpoint_id)
        if path.exists():
            return  # immutable: the same id always names the same bytes
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def get(self, checkpoint_id: str) -> bytes | None:
        try:
            return self._path(checkpoint_id).read_bytes()
        except FileNotFoundError:
            return None

    def delete(self, checkpoint_id: str) -> None:
        self._path(checkpoint_id).unlink(missing_ok=True)


class Snapshots(Protocol):
    """What a mode needs from a checkpoint provider."""

    whole_machine: bool

    async def checkpoint(self, space: Space, call_id: str, epoch: int) -> str: ...

    async def restore(
        self, space: Space, checkpoint_id: str, epoch: int, source: Space | None = None
    ) -> Space:
        """Make the Space equal to the checkpoint; returns the Space to use afterwards
        (a machine restore replaces it). Raises ``CheckpointMissing`` if it is gone."""
        ...

    def can_rebuild(self) -> bool:
        """Whether a checkpoint survives the loss of its Space."""
        ...


class CheckpointMissing(SpaceError):
    """A recorded checkpoint can no longer be found (in the Space or a store)."""


def check_archive(data: bytes) -> None:
    """Refuse an archive that could write outside the workspace when extracted."""
    links: set[str] = set()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar.getmembers():
            name = posixpath.normpath(m.name)
            if name == ".":
                continue
            if name.startswith("/") or name == ".." or name.startswith("../"):
                raise PathEscapeError(f"checkpoint member escapes the workspace: {m.name!r}")
            parts = name.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in links:
                    raise PathEscapeError(f"checkpoint member under a symlink: {m.name!r}")
            if m.islnk():
                target = posixpath.normpath(m.linkname)
                if target.startswith("/") or target.startswith(".."):
                    raise PathEscapeError(f"hard link out of the workspace: {m.name!r}")
            elif m.issym():
                links.add(name)
            elif not (m.isfile() or m.isdir()):
                raise PathEscapeError(f"special file in checkpoint: {m.name!r}")


class WorkspaceSnapshots:
    """Checkpoints of one directory tree (the workspace) through the Space's daemon."""

    whole_machine = False

    def __init__(
        self,
        spaces: SpaceBackend | None = None,
        root: str | None = None,
        store: CheckpointStore | None = None,
        prune_every: int = 8,
    ) -> None:
        self.spaces = spaces
        self.root = root
        self.store = store
        #: With a store, the copies inside the Space are only a fast path for recovery:
        #: every ``prune_every``-th prune call deletes the ones the log no longer records
        #: (one command; 0: never). Without a store they are the only copies (review and
        #: forks read them), so they are all kept.
        self.prune_every = prune_every
        self._prune_calls: dict[str, int] = {}

    def can_rebuild(self) -> bool:
        return self.store is not None

    @staticmethod
    def _dir(space: Space) -> str:
        return posixpath.join(posixpath.dirname(space.root.rstrip("/")), ".ds-checkpoints")

    async def _sh(self, space: Space, script: str, epoch: int, stdin: bytes | None = None) -> bytes:
        res = await space.exec(["bash", "-c", script], key=None, epoch=epoch, cwd="/", stdin=stdin)
        if res.exit_code != 0:
            raise SpaceError(f"checkpoint command failed ({res.exit_code}): {res.output[-300:]!r}")
        return res.output

    async def checkpoint(self, space: Space, call_id: str, epoch: int) -> str:
        root = space.root
        d = self._dir(space)
        tmp = f"{d}/.pending-{_slug(call_id)}.tar"
        data = await self._sh(
            space,
            f"mkdir -p {_q(d)} && set -o pipefail && "
            f"tar --numeric-owner --sort=name -cf - -C {_q(root)} . 2>/dev/null "
            f"| tee {_q(tmp)} && {{ sync {_q(tmp)} 2>/dev/null || true; }}",
            epoch,
        )
        cid = f"{_slug(call_id)}-{hashlib.sha256(data).hexdigest()[:16]}"
        if self.store is not None:
            self.store.put(cid, data)
        # The copy inside the Space is the tee'd stream of the same tar: no upload back.
        await self._sh(space, f"mv -f {_q(tmp)} {_q(d)}/{cid}.tar", epoch)
        return cid

    async def prune(self, space: Space, recorded: Callable[[], set[str]], epoch: int) -> list[str]:
        """Delete the Space's copies of checkpoints the log no longer records (and tars
        left pending by killed drivers), when a store holds every checkpoint anyway.
        ``recorded()`` is only asked when this call prunes."""
        if self.store is None or not self.prune_every:
            return []
        n = self._prune_calls[space.name] = self._prune_calls.get(space.name, 0) + 1
        if n % self.prune_every:
            return []
        keep = "|".join(_q(f"{cid}.tar") for cid in sorted(recorded())) or "''"
        out = await self._sh(
            space,
            f"cd {_q(self._dir(space))} 2>/dev/null || exit 0; "
            f'for f in *.tar .pending-*.tar; do [ -e "$f" ] || continue; '
            f'case "$f" in {keep}) ;; *) rm -f -- "$f" && echo "$f";; esac; done',
            epoch,
        )
        return [n.removesuffix(".tar") for n in out.decode(errors="replace").split()]

    async def _keep(self, space: Space, checkpoint_id: str, data: bytes, epoch: int) -> None:
        d = self._dir(space)
        await self._sh(
            space,
            f"mkdir -p {_q(d)} && cat > {_q(d)}/.{checkpoint_id}.tmp && "
            f"mv -f {_q(d)}/.{checkpoint_id}.tmp {_q(d)}/{checkpoint_id}.tar",
            epoch,
            stdin=data,
        )

    async def _fetch(self, space: Space, checkpoint_id: str, epoch: int) -> bytes:
        if self.store is not None:
            data = self.store.get(checkpoint_id)
            if data is not None:
                return data
        res = await space.exec(
            [
                "bash",
                "-c",
                f"cat {_q(posixpath.join(self._dir(space), checkpoint_id + '.tar'))} 2>/dev/null",
            ],
            key=None,
            epoch=epoch,
            cwd="/",
        )
        if res.exit_code != 0:
            raise CheckpointMissing(
                f"checkpoint {checkpoint_id} is gone (not in the Space"
                f"{'' if self.store is None else ' nor in the store'})"
            )
        return res.output

    async def restore(
        self, space: Space, checkpoint_id: str, epoch: int, source: Space | None = None
    ) -> Space:
        try:
            data = await self._fetch(space, checkpoint_id, epoch)
        except CheckpointMissing:
            if source is None:
                raise
            # A fork's first use: the checkpoint lives in the parent's Space. Read it at
            # the parent's own floor (never raise a Space's epoch just to read from it),
            # and keep a copy here so this Space's own recovery can restore it too.
            data = await self._fetch(source, checkpoint_id, max(1, await source.current_epoch()))
            await self._keep(space, checkpoint_id, data, epoch)
        check_archive(data)
        hit("snapshots.restore")  # a restore paused here must never land after a takeover
        root = _q(space.root)
        await self._sh(
            space,
            f"mkdir -p {root} && find {root} -mindepth 1 -delete && "
            f"tar --no-same-owner -xf - -C {root}",
            epoch,
            stdin=data,
        )
        return space


class SandboxSnapshots:
    """Whole-machine checkpoints (memory and disk) taken by the backend (microVM).

    Checkpoints live with the backend on this machine; another machine needs
    ``WorkspaceSnapshots`` with a shared store.
    """

    whole_machine = True

    def __init__(self, backend: SpaceBackend) -> None:
        self.backend = backend

    def can_rebuild(self) -> bool:
        return True  # the checkpoint lives with the backend, outside the Space

    async def checkpoint(self, space: Space, call_id: str, epoch: int) -> str:
        return str(await self.backend.checkpoint(space.name, epoch))  # type: ignore[attr-defined]

    async def restore(
        self, space: Space, checkpoint_id: str, epoch: int, source: Space | None = None
    ) -> Space:
        hit("snapshots.restore")
        # Fenced by the backend against its host floor; the restored guest is raised to
        # that floor before anyone else can reach it.
        await self.backend.restore(space.name, checkpoint_id, epoch)  # type: ignore[attr-defined]
        new = await self.backend.find(space.name)
        if new is None:
            # Removed while it was being restored: a lost Space (the next drive places it
            # again from the checkpoint), not a missing checkpoint.
            raise SpaceGoneError(f"Space {space.name} vanished while {checkpoint_id} was restored")
        # The restored daemon has the checkpoint's older floor: raise it before anything.
        await new.advance_epoch(epoch)
        return new

    async def prune(self, space: Space, recorded: Callable[[], set[str]], epoch: int) -> list[str]:
        """Delete the Space's checkpoints that no recorded checkpoint refers to: a machine
        checkpoint holds the guest's memory (tens of MB), so unreferenced ones must go.
        ``recorded()`` is every checkpoint the log still names, forks included."""
        prune_space = getattr(self.backend, "prune_space", None)
        if prune_space is None:
            return []
        return list(await prune_space(space.name, recorded()))


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in s)[:40]
