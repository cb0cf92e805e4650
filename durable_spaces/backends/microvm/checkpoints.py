"""The machine checkpoints of a microvm backend on disk, and the disk pool they share.

Layout under the backend's state directory::

    checkpoints/<id>/     memory or memory.zst (0400), meta.json, token (0400)
    checkpoints/<id>.part a checkpoint being written (renamed into place when complete)
    checkpoints/<id>.del  a checkpoint being removed (renamed first: nobody lists it)
    disks/<id>.qcow2      every qcow2 layer (a pool: chains share frozen layers)

An id is 24 hex digits (``durable_spaces.space.machine_checkpoint_id``): an id read back
from a log never becomes a path outside ``checkpoints/``. Checkpoint files are immutable
once written. A layer goes when no Space chain and no checkpoint refers to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import time
from dataclasses import asdict, dataclass

from durable_spaces.backends.microvm.machines import Source
from durable_spaces.backends.microvm.state import StateFiles
from durable_spaces.errors import SpaceError
from durable_spaces.host.bounded import load_object
from durable_spaces.space import MACHINE_CHECKPOINT_ID, machine_checkpoint_id


@dataclass
class CheckpointMeta:
    id: str
    space: str
    created: float
    chain: list[str]
    memory_mb: int
    accel: str
    image: str
    pause_s: float = 0.0
    memory_bytes: int = 0


def checkpoint_dir(state_dir: pathlib.Path, checkpoint_id: str) -> pathlib.Path:
    """Where checkpoint ``checkpoints.ids`` lives; ``BadCheckpointIdError`` (a ValueError)
    for anything but a machine checkpoint id."""
    return state_dir / "checkpoints" / machine_checkpoint_id(checkpoint_id, "a microvm checkpoint")


def _valid(name: str) -> bool:
    return MACHINE_CHECKPOINT_ID.fullmatch(name) is not None


class CheckpointFiles:
    """The checkpoints and disk layers under ``files.state_dir``."""

    def __init__(self, files: StateFiles) -> None:
        self.files = files
        self.state_dir = files.state_dir
        for d in ("disks", "checkpoints"):
            (self.state_dir / d).mkdir(parents=True, exist_ok=True)

    def dir(self, checkpoint_id: str) -> pathlib.Path:
        return checkpoint_dir(self.state_dir, checkpoint_id)

    def meta(self, checkpoint_id: str) -> CheckpointMeta:
        d = self.dir(checkpoint_id)
        try:
            return CheckpointMeta(**load_object(d / "meta.json"))
        except FileNotFoundError:
            raise SpaceError(f"no checkpoint {checkpoint_id!r}") from None
        except (ValueError, TypeError) as e:  # BadFileError: a FIFO, too big, too deep
            raise SpaceError(f"checkpoint {checkpoint_id!r}: {e}") from None

    def ids(self) -> list[str]:
        return sorted(
            p.name
            for p in (self.state_dir / "checkpoints").iterdir()
            if _valid(p.name) and (p / "meta.json").exists()
        )

    def source(self, checkpoint_id: str, memory_mb: int, accel: str, image: str) -> Source:
        """What a machine restores from, refused when the checkpoint was taken by another
        memory size, accelerator or image (QEMU could not load it)."""
        meta = self.meta(checkpoint_id)
        if (meta.memory_mb, meta.accel, meta.image) != (memory_mb, accel, image):
            raise SpaceError(
                f"checkpoint {checkpoint_id} was taken with {meta.memory_mb} MiB/{meta.accel}/"
                f"{meta.image}; this backend runs {memory_mb} MiB/{accel}/{image}"
            )
        d = self.dir(checkpoint_id)
        mem = d / "memory.zst" if (d / "memory.zst").exists() else d / "memory"
        return Source(mem, meta.chain, d / "token")

    def write(self, part: pathlib.Path, token: str, meta: CheckpointMeta) -> None:
        """Complete the checkpoint being written in ``part`` (its memory already there):
        its token and meta, read-only, then rename it into place."""
        tok = part / "token"
        fd = os.open(tok, os.O_CREAT | os.O_WRONLY, 0o400)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        (part / "meta.json").write_text(json.dumps(asdict(meta)))
        (part / "meta.json").chmod(0o400)
        part.rename(self.dir(meta.id))

    def remove(self, cid: str) -> None:
        d = self.dir(cid)
        trash = d.with_name(d.name + ".del")
        with contextlib.suppress(OSError):
            d.rename(trash)  # atomic: from here on nobody lists or restores it
        self._remove_trash(trash)

    @staticmethod
    def _remove_trash(trash: pathlib.Path) -> None:
        with contextlib.suppress(OSError):
            for f in trash.iterdir():
                f.chmod(0o600)
        shutil.rmtree(trash, ignore_errors=True)

    async def prune(self, keep: set[str], space: str | None) -> list[str]:
        """Delete the checkpoints not in ``keep`` (of Space ``space`` only, and never one
        a living Space was restored or forked from, when given); returns the ids removed."""
        in_use = {st.restored_from for st in self.files.states() if st.restored_from}
        removed = []
        for cid in self.ids():
            if cid in keep or (space is not None and cid in in_use):
                continue
            if space is not None:
                try:
                    if self.meta(cid).space != space:
                        continue
                except (SpaceError, OSError, ValueError, TypeError):
                    continue  # being pruned by someone else, or not ours to judge
            self.remove(cid)
            removed.append(cid)
        await self.gc()
        return removed

    async def retain(self, name: str, keep: int) -> None:
        """Drop Space ``name``'s oldest checkpoints beyond ``keep`` (0: keep all), never
        the one it was last restored from."""
        if not keep:
            return
        mine = []
        for p in (self.state_dir / "checkpoints").iterdir():
            if not _valid(p.name):
                continue  # being written (.part) or deleted (.del)
            with contextlib.suppress(OSError, ValueError, KeyError):
                meta = load_object(p / "meta.json")
                if meta["space"] == name:
                    mine.append((float(meta["created"]), p.name))
        mine.sort()
        st = self.files.read(name)
        protected = st.restored_from if st is not None else ""
        for _, cid in mine[: max(0, len(mine) - keep)]:
            if cid != protected:
                self.remove(cid)
        await self.gc()

    async def gc(self) -> None:
        """Remove pool layers that no Space chain and no checkpoint refers to."""
        async with self.files.lock("pool"):
            used: set[str] = set()
            for st in self.files.states():
                used.update(st.chain)
            for p in (self.state_dir / "checkpoints").iterdir():
                if not _valid(p.name):
                    continue  # being written (.part) or deleted (.del)
                with contextlib.suppress(OSError, ValueError, TypeError):
                    used.update(load_object(p / "meta.json")["chain"])
            cutoff = time.time() - 5  # a layer being created right now has no owner yet
            for layer in (self.state_dir / "disks").glob("*.qcow2"):
                if str(layer) not in used and layer.stat().st_mtime < cutoff:
                    layer.unlink(missing_ok=True)
            for p in (self.state_dir / "checkpoints").glob("*.part"):
                if p.stat().st_mtime < cutoff - 600:
                    shutil.rmtree(p, ignore_errors=True)
            for p in (self.state_dir / "checkpoints").glob("*.del"):
                self._remove_trash(p)  # a prune killed half-way
