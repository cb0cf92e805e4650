"""No take-back deletes what nothing else holds: the quarantine.

The adapter takes a workspace back to what the log implies in five places: a
transactional revert (a call whose outcome is unknown), a reimage, a checkpoint restore
(before the call, or the newest after the machine rebooted), a log that lost its tail
(``log_behind``), and a Space taken back to this log (``DS_SPACE_ADOPT=log``). Each
deletes or overwrites whatever differs. Most of that is held elsewhere: a file's bytes
are a blob of the log's image, or of the checkpoint being restored. What is not (a file
the user added by hand since the last call, the bytes an interrupted command wrote, a
symlink, a name the image cannot hold) would be gone for good.

So before the first change, the adapter compares the workspace with what it is taken
back to. When something at risk is held by neither (a blob of the log, or of the target
checkpoint), the whole workspace is kept first as a *quarantine checkpoint*: a checkpoint
of the adapter's own provider (incremental: only the blobs no checkpoint stored yet cost
anything; a machine's for whole-machine checkpoints, whose target cannot be read, so every
machine restore keeps the machine first). Its record (``cua.quarantine``, one document
per conversation: the checkpoint, when, why, the Space, the paths at risk) is committed
before anything is deleted, and the recovery event that takes the workspace back names
it (``quarantine``). Killed between the two, the checkpoint is only unrecorded garbage;
killed after, the take-back starts again and keeps what is still at risk.

It is read through the review API (``review.quarantines``, ``review.quarantined``), and
listed and restored into a directory by ``durable-spaces quarantine``. It is kept for at
least ``DS_QUARANTINE_DAYS`` (``settings.py``): until then every prune counts it as
recorded (``kept``); after, it is pruned as any checkpoint the log no longer names.

Cheap on the common path: nothing happens on a call, and a take-back that deletes only
what the log or the checkpoint holds costs one comparison of tables it reads anyway (a
checkpoint restore reads the target's manifest once more).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import PermanentFailure
from durable_spaces.space import PathEntry, PathTable, Space

if TYPE_CHECKING:
    from durable_spaces.adapter.checkpoints.snapshots import Snapshots
    from durable_spaces.harness.handles import HarnessView
    from durable_spaces.harness.state import Tx

DOC = "cua.quarantine"
#: Paths a record names (the checkpoint holds them all).
SHOWN = 20
#: Why a workspace was taken back.
WHY = ("reverted", "reimaged", "restored", "log_behind", "claimed")
DAY_S = 86400
_FIELDS = {"checkpoint", "at", "why", "space", "count", "paths"}

#: What a path holds: ("file", sha256), ("symlink", target) or ("unsupported", None).
Content = tuple[str, str | None]


def content(entry: PathEntry) -> Content:
    if entry.kind == "file":
        return ("file", entry.sha256)
    if entry.kind == "symlink":
        return ("symlink", entry.target)
    return ("unsupported", None)  # never equal to a target's: always at risk


def at_risk(current: PathTable, target: Mapping[str, Content]) -> list[str]:
    """The paths whose content a take-back to ``target`` deletes or replaces."""
    return sorted(p for p, e in current.items() if target.get(p) != content(e))


@dataclass(frozen=True)
class Kept:
    """One quarantine: its checkpoint, when (unix seconds), why, the Space, how many
    paths were at risk and the first of them."""

    checkpoint: str
    at: int
    why: str
    space: str
    count: int
    paths: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "paths": list(self.paths)}

    @staticmethod
    def from_json(d: object) -> Kept:
        """A record read back from the log: its checkpoint id becomes a file name and a
        shell word, so everything is checked (``PermanentFailure``: the log is damaged)."""
        where = f"the log's {DOC} document"
        damaged = PermanentFailure(f"{where} is damaged: {str(d)[:80]!r}")
        if not isinstance(d, dict) or set(d) != {
            "checkpoint",
            "at",
            "why",
            "space",
            "count",
            "paths",
        }:
            raise damaged
        at, why, space, count, paths = d["at"], d["why"], d["space"], d["count"], d["paths"]
        if type(at) is not int or at < 0 or why not in WHY or not isinstance(space, str):
            raise damaged
        if type(count) is not int or count < 0 or not isinstance(paths, list):
            raise damaged
        if not all(isinstance(p, str) for p in paths):
            raise damaged
        cid = CheckpointId.parse(d["checkpoint"], f"{where} (checkpoint)")
        return Kept(str(cid), at, why, space, count, tuple(paths))

    def expires(self, days: int) -> int:
        return self.at + days * DAY_S


def records(harness: HarnessView, conv: str) -> list[Kept]:
    """The conversation's quarantines, oldest first."""
    raw = harness.conversation(conv).document(DOC) or []
    if not isinstance(raw, list):
        raise PermanentFailure(f"the log's {DOC} document is damaged: not a list")
    return [Kept.from_json(d) for d in raw]


def kept(harness: HarnessView, days: int, now: float | None = None) -> set[str]:
    """The checkpoints of every conversation's quarantines younger than ``days``: a
    prune must count them as recorded."""
    now = time.time() if now is None else now
    return {
        k.checkpoint
        for c in harness.conversations()
        for k in records(harness, c.id)
        if k.expires(days) > now
    }


@dataclass(frozen=True)
class Quarantine:
    """Keeps what a take-back would delete that nothing else holds (module doc), with
    the adapter's checkpoint provider, for ``days`` at least."""

    snapshots: Snapshots
    days: int
    epoch_for: Callable[[str], int]

    async def keep(
        self,
        harness: HarnessView,
        conv: str,
        space: Space,
        risky: list[str],
        why: str,
    ) -> str | None:
        """When ``risky`` (paths at risk that nothing holds) is not empty: checkpoint the
        workspace, make sure the checkpoint is kept, commit its record; its id."""
        if not risky:
            return None
        epoch = self.epoch_for(space.name)
        cid = await self.snapshots.checkpoint(space, "quarantine", epoch)
        # Without a store the Space's copy is the only one: written before any delete.
        release = getattr(self.snapshots, "release", None)
        settle = getattr(self.snapshots, "settle", None)
        if release is not None and settle is not None:
            release(space.name)
            await settle(space.name)
        rec = Kept(str(cid), int(time.time()), why, space.name, len(risky), tuple(risky[:SHOWN]))
        now = time.time()
        days = self.days

        def build(tx: Tx) -> None:
            keep = [k for k in records(harness, conv) if k.expires(days) > now]
            tx.put_document(conv, DOC, [k.to_json() for k in [*keep, rec]])

        await harness.commit(build)
        hit("recovery.quarantined")
        return str(cid)

    async def before_machine_restore(
        self, harness: HarnessView, conv: str, space: Space, why: str
    ) -> str | None:
        """A machine checkpoint's workspace cannot be read to compare: keep the machine
        first whenever its workspace holds anything."""
        table = await space.scan(".")
        return await self.keep(harness, conv, space, sorted(table), why)
