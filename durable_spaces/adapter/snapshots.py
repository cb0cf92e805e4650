"""Checkpoints of a Space: of its workspace (``WorkspaceSnapshots``) or of the whole
machine (``SandboxSnapshots``).

A workspace checkpoint is a tar of the workspace's files, directories and symlinks
taken through the Space's daemon; its id records the tar's sha256
(``checkpoint_id.CheckpointId``). It is kept inside the Space (beside the workspace, not
in it) and, with a ``CheckpointStore``, also outside the Space, so a lost Space can be
rebuilt from the newest one on this machine or another.

Restores never trust a copy: its bytes must match the id's digest and every member is
checked (no absolute names, no ``..``, nothing under a symlink member, no links out, no
devices) before ``tar -x`` runs into a staging directory. A bad copy (tampered, torn, a
symlink planted in its place, refused) is passed over for the next one; when none is
intact the restore fails with ``CheckpointCorruptError`` (permanent), never a tool error.

A machine checkpoint (microVM) holds memory and disk; it lives with the backend.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import posixpath
import shlex
import tarfile
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Protocol

from durable_spaces.adapter.checkpoint_id import CheckpointId, slug
from durable_spaces.adapter.checkpoint_store import CheckpointStore, DirectoryCheckpointStore
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import (
    CheckpointCopyError,
    CheckpointCorruptError,
    PathEscapeError,
    SpaceError,
    SpaceGoneError,
    SpaceUnavailableError,
)
from durable_spaces.space import Space, SpaceBackend

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


class CheckpointMissing(SpaceError):
    """A recorded checkpoint can no longer be found (in the Space or a store)."""


def check_archive(data: bytes) -> None:
    """Refuse an archive that could write outside the workspace when extracted: names
    that are absolute or climb out, members under a symlink member, hard links to
    anything but an earlier file or symlink member, devices, FIFOs and sockets."""
    links: set[str] = set()
    seen: dict[str, str] = {}  # earlier members that a hard link may name: name -> kind
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar.getmembers():
            name = _inside(m.name, m.name, "checkpoint member escapes the workspace")
            if name == ".":
                continue
            if _under(name, links):
                raise PathEscapeError(f"checkpoint member under a symlink: {m.name!r}")
            if m.islnk():
                target = _inside(m.linkname, m.name, "hard link out of the workspace")
                kind = seen.get(target)
                if kind is None or _under(target, links):
                    raise PathEscapeError(
                        f"hard link to no earlier file of the checkpoint: {m.name!r} -> "
                        f"{m.linkname!r}"
                    )
                if kind == "symlink":
                    links.add(name)
                seen[name] = kind
            elif m.issym():
                links.add(name)
                seen[name] = "symlink"
            elif m.isfile():
                seen[name] = "file"
            elif not m.isdir():
                raise PathEscapeError(f"special file in checkpoint: {m.name!r}")
            else:
                seen.pop(name, None)


def _inside(raw: str, member: str, why: str) -> str:
    name = posixpath.normpath(raw) if raw else "."
    if name.startswith("/") or name == ".." or name.startswith("../"):
        raise PathEscapeError(f"{why}: {member!r}")
    return name


def _under(name: str, links: set[str]) -> bool:
    parts = name.split("/")
    return any("/".join(parts[:i]) in links for i in range(1, len(parts)))


def archive_problem(cid: CheckpointId, data: bytes) -> str | None:
    """What is wrong with ``data`` as the checkpoint ``cid`` (None: it is intact)."""
    if not cid.matches(data):
        actual = hashlib.sha256(data).hexdigest()
        return f"content does not match its id (sha256 {actual[:16]}..., {len(data)} bytes)"
    try:
        check_archive(data)
    except PathEscapeError as e:
        return f"archive refused: {e}"
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        return f"not a readable tar: {e}"
    return None


class _Copies:
    """The copies of one checkpoint tried so far, and what was wrong with each."""

    def __init__(self, cid: CheckpointId) -> None:
        self.cid = cid
        self.problems: list[str] = []
        self.bad: set[str] = set()  # keys of copies that exist but are not intact

    def refuse(self, key: str, where: str, why: str) -> None:
        self.bad.add(key)
        self.problems.append(f"{where}: {why}")
        logger.warning("checkpoint %s: the copy in %s is bad: %s", self.cid, where, why)

    async def verified(
        self, key: str, where: str, load: Callable[[], Awaitable[bytes | None]]
    ) -> bytes | None:
        """The copy's bytes if it is there and intact, else None (and why, recorded)."""
        try:
            data = await load()
        except CheckpointCopyError as e:
            self.refuse(key, where, str(e))
            return None
        if data is None:
            self.problems.append(f"{where}: missing")
            return None
        why = archive_problem(self.cid, data)
        if why is not None:
            self.refuse(key, where, why)
            return None
        return data

    def error(self) -> SpaceError | CheckpointCorruptError:
        if not self.bad:
            return CheckpointMissing(f"checkpoint {self.cid} is gone ({'; '.join(self.problems)})")
        return CheckpointCorruptError(self.cid, self.problems)


class WorkspaceSnapshots:
    """Checkpoints of one directory tree (the workspace) through the Space's daemon.

    Only regular files, directories and symlinks are captured: FIFOs, sockets and device
    nodes in the workspace are left out (transactional mode does not track them either),
    so none of them can make a later restore fail, and no checkpoint ever opens one."""

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
        d = self._dir(space)
        tmp = _q(f"{d}/.pending-{slug(call_id)}.tar")
        # The list is sorted (tar's --sort=name does not apply to -T), so the same tree
        # gives the same bytes. A planted FIFO or link at the pending name is removed
        # first: tee never opens one.
        data = await self._sh(
            space,
            f"mkdir -p {_q(d)} && rm -rf -- {tmp} && cd {_q(space.root)} && set -o pipefail && "
            r"find . \( -type f -o -type d -o -type l \) -print0 2>/dev/null "
            "| LC_ALL=C sort -z 2>/dev/null "
            "| tar --null --no-recursion -T - --numeric-owner --sort=name -cf - 2>/dev/null "
            f"| tee {tmp} && {{ sync {tmp} 2>/dev/null || true; }}",
            epoch,
        )
        try:
            check_archive(data)
        except (PathEscapeError, tarfile.TarError, EOFError, ValueError) as e:
            # Only a race (a directory swapped for a link, a FIFO made mid-list) gets here:
            # never record a checkpoint that could not be restored.
            raise SpaceError(f"the checkpoint of Space {space.name} would not restore: {e}") from e
        cid = CheckpointId.for_tar(call_id, data)
        if self.store is not None:
            self.store.put(cid, data)
        # The copy inside the Space is the tee'd stream of the same tar: no upload back.
        await self._sh(space, _install(tmp, _q(f"{d}/{cid}.tar")), epoch)
        return cid

    async def prune(self, space: Space, recorded: Callable[[], set[str]], epoch: int) -> list[str]:
        """Delete the Space's copies of checkpoints the log no longer records (and tars
        left pending or restores left half-way by killed drivers), when a store holds
        every checkpoint anyway. ``recorded()`` is only asked when this call prunes."""
        if self.store is None or not self.prune_every:
            return []
        n = self._prune_calls[space.name] = self._prune_calls.get(space.name, 0) + 1
        if n % self.prune_every:
            return []
        keep = "|".join(_q(f"{cid}.tar") for cid in sorted(recorded())) or "''"
        out = await self._sh(
            space,
            f"cd {_q(self._dir(space))} 2>/dev/null || exit 0; rm -rf -- .restore-*; "
            f'for f in *.tar .pending-*.tar; do [ -e "$f" ] || [ -L "$f" ] || continue; '
            f'case "$f" in {keep}) ;; *) rm -f -- "$f" && printf "%s\\0" "$f";; esac; done; '
            "exit 0",
            epoch,
        )
        names = out.decode(errors="replace").split("\0")
        found = (CheckpointId.valid(f.removesuffix(".tar"), "workspace") for f in names)
        return [c for c in found if c is not None]

    async def _keep(self, space: Space, cid: CheckpointId, data: bytes, epoch: int) -> None:
        d = self._dir(space)
        tmp = _q(f"{d}/.{cid}.tmp")
        await self._sh(
            space,
            f"mkdir -p {_q(d)} && rm -rf -- {tmp} && cat > {tmp} && "
            + _install(tmp, _q(f"{d}/{cid}.tar")),
            epoch,
            stdin=data,
        )

    def _where(self, cid: CheckpointId, space: Space | None = None) -> str:
        if space is not None:
            return f"Space {space.name} ({self._dir(space)}/{cid}.tar)"
        location = getattr(self.store, "location", None)
        return f"the store ({location(cid)})" if location is not None else "the store"

    async def _store_copy(self, cid: CheckpointId) -> bytes | None:
        assert self.store is not None
        try:
            return self.store.get(cid)
        except OSError as e:
            raise CheckpointCopyError(f"unreadable: {e}") from None

    async def _space_copy(self, space: Space, cid: CheckpointId, epoch: int | None) -> bytes | None:
        """The copy beside the workspace (None if absent); a symlink, FIFO or directory
        there is a bad copy, never followed or opened for a blocking read. ``epoch``
        None reads at the Space's own floor (never raise a Space's epoch to read it)."""
        if epoch is None:
            epoch = max(1, await space.current_epoch())
        f = _q(f"{self._dir(space)}/{cid}.tar")
        res = await space.exec(
            [
                "bash",
                "-c",
                f'f={f}; if [ -L "$f" ]; then exit 3; elif [ ! -e "$f" ]; then exit 4; '
                f'elif [ ! -f "$f" ]; then exit 5; fi; '
                f'exec dd if="$f" iflag=nofollow,nonblock bs=1M status=none 2>/dev/null',
            ],
            key=None,
            epoch=epoch,
            cwd="/",
        )
        if res.exit_code == 0:
            return res.output
        if res.exit_code == 4:
            return None
        raise CheckpointCopyError(
            {3: "a symlink", 5: "not a regular file"}.get(
                res.exit_code or 0, f"unreadable (exit {res.exit_code})"
            )
        )

    async def read_intact(self, checkpoint_id: str, spaces: AsyncIterable[Space]) -> bytes:
        """The first intact copy of a checkpoint: the store's, then each Space's (read at
        its own floor). Raises ``CheckpointMissing`` / ``CheckpointCorruptError``."""
        cid = CheckpointId.parse(checkpoint_id, "the checkpoint to read", "workspace")
        copies = _Copies(cid)
        if self.store is not None:
            data = await copies.verified("store", self._where(cid), lambda: self._store_copy(cid))
            if data is not None:
                return data
        async for sp in spaces:
            data = await copies.verified(
                sp.name, self._where(cid, sp), functools.partial(self._space_copy, sp, cid, None)
            )
            if data is not None:
                return data
        raise copies.error()

    async def restore(
        self, space: Space, checkpoint_id: str, epoch: int, source: Space | None = None
    ) -> Space:
        """Restore the first intact copy: the store's, the one in the Space, then (a
        fork's first use) the parent Space's, read at the parent's own floor. A copy
        is intact when its sha256 matches the id's digest and ``check_archive`` and
        ``tar -x`` (into a staging directory) accept it; only then is the workspace
        replaced. A bad copy is reported (a warning naming it) and mended from the
        intact one."""
        cid = CheckpointId.parse(checkpoint_id, "the checkpoint to restore", "workspace")
        copies = _Copies(cid)
        tries: list[tuple[str, Space | None, Callable[[], Awaitable[bytes | None]]]] = []
        if self.store is not None:
            tries.append(("store", None, lambda: self._store_copy(cid)))
        tries.append(("space", space, lambda: self._space_copy(space, cid, epoch)))
        if source is not None:
            tries.append(("parent", source, lambda: self._space_copy(source, cid, None)))
        for key, where, load in tries:
            data = await copies.verified(key, self._where(cid, where), load)
            if data is None:
                continue
            hit("snapshots.restore")  # a restore paused here must never land after a takeover
            why = await self._extract(space, cid, data, epoch)
            if why is not None:
                copies.refuse(key, self._where(cid, where), f"tar -x failed: {why}")
                continue
            await self._mend(space, cid, data, epoch, copies, key)
            return space
        raise copies.error()

    async def _extract(
        self, space: Space, cid: CheckpointId, data: bytes, epoch: int
    ) -> str | None:
        """Extract into a staging directory beside the workspace, then swap the contents
        in: a tar that fails leaves the workspace untouched (returns tar's complaint)."""
        root = _q(space.root)
        staging = _q(f"{self._dir(space)}/.restore-{cid}")
        res = await space.exec(
            [
                "bash",
                "-c",
                f's={staging}; rm -rf -- "$s" && mkdir -p -- "$s" || exit 2; '
                f'tar --no-same-owner -xf - -C "$s" 2>&1 || {{ rm -rf -- "$s"; exit 3; }}; '
                f"mkdir -p -- {root} && find {root} -mindepth 1 -delete && "
                f'find "$s" -mindepth 1 -maxdepth 1 -exec mv -t {root} -- {{}} + && '
                f'chmod --reference="$s" -- {root} && rmdir -- "$s"',
            ],
            key=None,
            epoch=epoch,
            cwd="/",
            stdin=data,
        )
        if res.exit_code == 3:
            return res.output[-300:].decode(errors="replace").strip() or "exit 3"
        if res.exit_code != 0:
            raise SpaceError(f"restore of {cid} failed ({res.exit_code}): {res.output[-300:]!r}")
        return None

    async def _mend(
        self, space: Space, cid: CheckpointId, data: bytes, epoch: int, copies: _Copies, won: str
    ) -> None:
        """After a restore from ``won``: rewrite a bad store copy, and keep a copy in the
        Space when its own was bad or the checkpoint came from the parent (so this
        Space's own recovery can restore it too). Housekeeping: failures only warn."""
        if self.store is not None and "store" in copies.bad:
            try:
                self.store.put(cid, data)
            except (OSError, CheckpointCopyError) as e:
                logger.warning("could not rewrite the store's copy of %s: %s", cid, e)
        if won != "space" and ("space" in copies.bad or won == "parent"):
            try:
                await self._keep(space, cid, data, epoch)
            except SpaceError as e:
                if won == "parent" or isinstance(e, SpaceUnavailableError):
                    raise
                logger.warning("could not rewrite the copy of %s in %s: %s", cid, space.name, e)


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
        cid = await self.backend.checkpoint(space.name, epoch)  # type: ignore[attr-defined]
        return CheckpointId.parse(cid, f"the backend's checkpoint of {space.name}", "machine")

    async def restore(
        self, space: Space, checkpoint_id: str, epoch: int, source: Space | None = None
    ) -> Space:
        cid = CheckpointId.parse(checkpoint_id, "the machine checkpoint to restore", "machine")
        hit("snapshots.restore")
        # Fenced by the backend against its host floor; the restored guest is raised to
        # that floor before anyone else can reach it.
        await self.backend.restore(space.name, cid, epoch)  # type: ignore[attr-defined]
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
        prune_space = getattr(self.backend, "prune_space", None)
        if prune_space is None:
            return []
        return list(await prune_space(space.name, recorded()))


def _q(s: str) -> str:
    return shlex.quote(s)


def _install(tmp: str, dest: str) -> str:
    """Shell: rename ``tmp`` over ``dest`` (both quoted), even if a directory was planted
    there (``mv`` would move into it); never into a symlink's target."""
    return (
        f"{{ if [ -d {dest} ] && [ ! -L {dest} ]; then rm -rf -- {dest}; fi; "
        f"mv -fT -- {tmp} {dest}; }}"
    )
