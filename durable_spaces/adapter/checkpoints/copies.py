"""The copies of one workspace checkpoint, tried in order, each checked before use.

A checkpoint has up to three copies: the store's, the one beside the Space's workspace,
and (a fork's first use) its parent Space's. ``load`` returns the first intact one as a
tar ready to extract: a tar checkpoint's bytes must match its id's digest and pass
``check_archive``; a manifest's bytes must match its id and ``manifest.decode``, and each
blob it names must hash to its name, taken from the first copy that holds it intact
(blobs are content-addressed, so copies can be mixed blob by blob). Whatever is wrong
with a copy is recorded, named by where it is, and reported as a warning; when nothing
intact is left the error names the checkpoint and every problem (``CheckpointCorruptError``),
or says it is gone (``CheckpointMissing``). After a restore, ``mend`` rewrites what a
copy lacked or had damaged, from the intact bytes.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints import space_copy
from durable_spaces.adapter.checkpoints.archive import archive_problem, check_archive
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.adapter.checkpoints.store import CheckpointStore, DirectoryCheckpointStore
from durable_spaces.errors import (
    CheckpointCopyError,
    CheckpointCorruptError,
    PathEscapeError,
    SpaceError,
)
from durable_spaces.space import Space

logger = logging.getLogger("durable_spaces.adapter.checkpoints.snapshots")


class CheckpointMissing(SpaceError):
    """A recorded checkpoint can no longer be found (in the Space or a store)."""


class Copy(Protocol):
    """One place a checkpoint may be: ``key`` is ``store``, ``space`` or ``parent``."""

    key: str

    def where(self, cid: CheckpointId) -> str: ...

    async def get(self, cid: CheckpointId) -> bytes | None: ...

    async def blobs(self, shas: set[str]) -> tuple[dict[str, bytes], dict[str, str]]:
        """The blobs it has (sha -> bytes) and those there but unusable (sha -> why)."""
        ...

    async def keep(self, cid: CheckpointId, data: bytes, blobs: dict[str, bytes]) -> None:
        """Write ``blobs`` (replacing bad ones) and the checkpoint's bytes ``data``."""
        ...


class StoreCopy:
    key = "store"

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store

    def where(self, cid: CheckpointId) -> str:
        location = getattr(self.store, "location", None)
        return f"the store ({location(cid)})" if location is not None else "the store"

    async def get(self, cid: CheckpointId) -> bytes | None:
        try:
            return self.store.get(cid)
        except OSError as e:
            raise CheckpointCopyError(f"unreadable: {e}") from None

    async def blobs(self, shas: set[str]) -> tuple[dict[str, bytes], dict[str, str]]:
        found: dict[str, bytes] = {}
        bad: dict[str, str] = {}
        for sha in shas:
            try:
                data = self.store.get_blob(sha)
            except (CheckpointCopyError, OSError) as e:
                bad[sha] = str(e)
                continue
            if data is not None:
                found[sha] = data
        return found, bad

    async def keep(self, cid: CheckpointId, data: bytes, blobs: dict[str, bytes]) -> None:
        with self.store.batch() as b:
            for blob in blobs.values():
                b.add(blob, replace=True)
            b.manifest(cid, data)


class HostCopy(StoreCopy):
    """The copy beside a workspace that is a directory of this host, read here."""

    key = "space"

    def __init__(self, space: Space, directory: str) -> None:
        super().__init__(DirectoryCheckpointStore(directory, in_space=True))
        self.space = space

    def where(self, cid: CheckpointId) -> str:
        return f"Space {self.space.name} ({self.store.location(cid)})"  # type: ignore[attr-defined]


class CommandCopy:
    """The copy beside a Space's workspace, through commands (``epoch`` None: read at
    the Space's own floor, e.g. a fork's parent)."""

    def __init__(self, key: str, space: Space, directory: str, epoch: int | None) -> None:
        self.key, self.space, self.dir, self.epoch = key, space, directory, epoch

    def where(self, cid: CheckpointId) -> str:
        return f"Space {self.space.name} ({self.dir}/{cid}{cid.suffix})"

    async def get(self, cid: CheckpointId) -> bytes | None:
        return await space_copy.read_file(self.space, self.dir, cid + cid.suffix, self.epoch)

    async def blobs(self, shas: set[str]) -> tuple[dict[str, bytes], dict[str, str]]:
        return await space_copy.read_blobs(self.space, self.dir, shas, self.epoch)

    async def keep(self, cid: CheckpointId, data: bytes, blobs: dict[str, bytes]) -> None:
        epoch = self.epoch if self.epoch is not None else await self.space.current_epoch()
        if cid.form == "tar":
            await space_copy.write_tar(self.space, self.dir, cid, data, epoch)
        else:
            await space_copy.write(self.space, self.dir, blobs, cid, data, epoch)


@dataclass
class Loaded:
    """An intact checkpoint: the tar to extract, where its pieces came from."""

    tar: bytes
    data: bytes  # the checkpoint's own bytes (the tar, or the manifest)
    manifest: mf.Manifest | None
    blobs: dict[str, bytes]
    won: str  # the copy the checkpoint's own bytes came from
    used: set[str] = field(default_factory=set)  # every copy something came from


class Copies:
    """The copies of one checkpoint tried so far, and what was wrong with each."""

    def __init__(self, cid: CheckpointId) -> None:
        self.cid = cid
        self.problems: list[str] = []
        self.bad: set[str] = set()  # keys of copies that exist but are not intact
        self.lacks: dict[str, set[str]] = {}  # copy key -> blobs it lacks or has damaged
        self.no_manifest: set[str] = set()  # copies whose own bytes are absent or bad

    def refuse(self, key: str, where: str, why: str) -> None:
        self.bad.add(key)
        self.problems.append(f"{where}: {why}")
        logger.warning("checkpoint %s: the copy in %s is bad: %s", self.cid, where, why)

    async def verified(
        self, copy: Copy, load: Callable[[], Awaitable[bytes | None]]
    ) -> bytes | None:
        """The copy's own bytes if there and matching the id (and, a tar, passing
        ``check_archive``), else None (and why, recorded)."""
        where = copy.where(self.cid)
        try:
            data = await load()
        except CheckpointCopyError as e:
            self.no_manifest.add(copy.key)
            self.refuse(copy.key, where, str(e))
            return None
        if data is None:
            self.no_manifest.add(copy.key)
            self.problems.append(f"{where}: missing")
            return None
        tar = self.cid.form == "tar"
        why = archive_problem(self.cid, data) if tar else self._manifest_problem(data)
        if why is not None:
            self.no_manifest.add(copy.key)
            self.refuse(copy.key, where, why)
            return None
        return data

    def _manifest_problem(self, data: bytes) -> str | None:
        if not self.cid.matches(data):
            actual = hashlib.sha256(data).hexdigest()
            return f"content does not match its id (sha256 {actual[:16]}..., {len(data)} bytes)"
        try:
            mf.decode(data)
        except mf.ManifestError as e:
            return f"manifest refused: {e}"
        return None

    def error(self) -> SpaceError | CheckpointCorruptError:
        if not self.bad:
            return CheckpointMissing(f"checkpoint {self.cid} is gone ({'; '.join(self.problems)})")
        return CheckpointCorruptError(self.cid, self.problems)

    async def manifest(self, copies: list[Copy]) -> mf.Manifest:
        """Only the manifest (of a manifest checkpoint), from its first intact copy."""
        for copy in copies:
            data = await self.verified(copy, lambda c=copy: c.get(self.cid))  # type: ignore[misc]
            if data is not None:
                return mf.decode(data)
        raise self.error()

    async def load(self, copies: list[Copy], skip: set[str] | None = None) -> Loaded:
        """The first intact checkpoint from ``copies`` (those in ``skip`` not tried for
        its own bytes: they failed to extract)."""
        for i, copy in enumerate(copies):
            if skip and copy.key in skip:
                continue
            data = await self.verified(copy, lambda c=copy: c.get(self.cid))  # type: ignore[misc]
            if data is None:
                continue
            if self.cid.form == "tar":
                return Loaded(data, data, None, {}, copy.key, {copy.key})
            loaded = await self._with_blobs(data, copy, [copy, *copies[:i], *copies[i + 1 :]])
            if loaded is not None:
                return loaded
        raise self.error()

    async def _with_blobs(self, data: bytes, owner: Copy, copies: list[Copy]) -> Loaded | None:
        m = mf.decode(data)
        need = mf.blobs(m)
        have: dict[str, bytes] = {}
        used = {owner.key}
        for copy in copies:
            missing = need - set(have)
            if not missing:
                break
            try:
                found, bad = await copy.blobs(missing)
            except CheckpointCopyError as e:
                self.refuse(copy.key, copy.where(self.cid), f"blobs: {e}")
                self.lacks.setdefault(copy.key, set()).update(missing)
                continue
            for sha, why in bad.items():
                self.refuse(copy.key, copy.where(self.cid), f"blob {sha}: {why}")
            for sha, blob in found.items():
                if hashlib.sha256(blob).hexdigest() != sha:
                    self.refuse(copy.key, copy.where(self.cid), f"blob {sha} is damaged")
                    continue
                have[sha] = blob
                used.add(copy.key)
            self.lacks.setdefault(copy.key, set()).update(missing - set(have))
        missing = need - set(have)
        if missing:
            paths = sorted(p for p, e in m.items() if e.kind == mf.FILE and e.ref in missing)
            self.bad.add(owner.key)
            self.problems.append(
                f"blob {sorted(missing)[0]} of {paths[0]!r} ({len(missing)} blob(s) in all) "
                "is in no copy intact"
            )
            return None
        tar = mf.to_tar(m, have.__getitem__)
        try:
            check_archive(tar)  # decode() already refused what this would
        except PathEscapeError as e:
            self.refuse(owner.key, owner.where(self.cid), f"manifest refused: {e}")
            return None
        return Loaded(tar, data, m, have, owner.key, used)

    async def mend(self, loaded: Loaded, copies: list[Copy], want: Callable[[Copy], bool]) -> None:
        """Rewrite, in each copy ``want`` says to, what it lacked or had damaged."""
        for copy in copies:
            lacks = self.lacks.get(copy.key, set())
            if not want(copy) or (copy.key not in self.no_manifest and not lacks):
                continue
            blobs = {s: loaded.blobs[s] for s in lacks if s in loaded.blobs}
            if copy.key in self.no_manifest and loaded.manifest is not None:
                blobs = {s: loaded.blobs[s] for s in mf.blobs(loaded.manifest)}
            try:
                await copy.keep(self.cid, loaded.data, blobs)
            except (OSError, CheckpointCopyError, SpaceError) as e:
                if copy.key == "space" and isinstance(e, SpaceError):
                    raise
                logger.warning("could not rewrite %s: %s", copy.where(self.cid), e)
