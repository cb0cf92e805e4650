"""The transactional image: the workspace as data in the log.

Why: a per-call checkpoint costs a tar of the whole workspace; the image costs only what
changed. The log holds a path table (path -> mode/size/sha256 or symlink target) as a
rewindable document, and each distinct blob once, content-addressed, as its own
document (written once, never changed). A call's diff is committed in the same
transaction as its outcome, so the image is always the workspace as of the last
committed call, and ``apply`` makes any workspace equal to it again.

Limits (``max_files``, ``max_bytes``) keep the log bounded; names with a backslash or a
newline (and trees deeper than a scan descends) come back from the scan as
``unsupported`` entries, which the image refuses. Empty directories, owners and
timestamps are not tracked (as in the reference). How the image is stored in the log is
``image_log.py``; this module is the path tables themselves: limits, diffs, applying one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from durable_spaces.chaos.failpoints import hit
from durable_spaces.space import PathEntry, PathTable, Space

DEFAULT_MAX_FILES = 1000
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ImageLimits:
    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_BYTES
    exclude: tuple[str, ...] = ()

    def violation(self, table: PathTable) -> str | None:
        """Why ``table`` cannot be the image (over the limits, or holding what the image
        cannot represent), or None."""
        files = size = 0
        bad = []
        for p, e in table.items():  # one pass: this runs twice per transactional call
            if e.kind == "file":
                files += 1
                size += e.size
            elif e.kind == "unsupported":
                bad.append(p)
        if bad:
            bad.sort()
            shown = ", ".join(f"{p!r} ({table[p].target})" for p in bad[:3])
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            return f"the workspace holds what the image cannot represent: {shown}{more}"
        if files > self.max_files:
            return f"workspace has {files} files, over max_files={self.max_files}"
        if size > self.max_bytes:
            return f"workspace holds {size} bytes, over max_bytes={self.max_bytes}"
        return None

    def violation_after_write(self, table: PathTable, rel: str, size: int) -> str | None:
        """Why the workspace ``table`` with ``rel`` written as a file of ``size`` bytes
        would be over ``max_bytes``, or None: known before the write, so explicit
        transactional mode refuses it as it refuses a name it cannot hold, instead of
        writing it and leaving the image stale. (A new file over ``max_files`` still
        goes through and marks the image stale, as a command's does.)"""
        if any(rel == x or rel.startswith(x.rstrip("/") + "/") for x in self.exclude):
            return None  # not in the image: no limit of the image's applies
        total = sum(e.size for e in table.values() if e.kind == "file")
        old = table.get(rel)
        was = old.size if old is not None and old.kind == "file" else 0
        after = total - was + size
        if after > self.max_bytes:
            return (
                f"{rel!r} of {size} bytes would make the workspace hold {after} bytes, "
                f"over max_bytes={self.max_bytes}"
            )
        return None


@dataclass
class Delta:
    """What turns one path table into another."""

    put: dict[str, PathEntry] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.put or self.delete)

    def apply(self, table: PathTable) -> PathTable:
        out = dict(table)
        for p in self.delete:
            out.pop(p, None)
        out.update(self.put)
        return out


def diff(old: Mapping[str, PathEntry], new: Mapping[str, PathEntry]) -> Delta:
    d = Delta()
    get = old.get
    for p, e in new.items():
        o = get(p)
        # The same object first: a scan's table and the image share unchanged entries,
        # and comparing 1000 dataclasses field by field was most of a diff's time.
        if o is not e and o != e:
            d.put[p] = e
    d.delete = sorted(p for p in old if p not in new)
    return d


def blob_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def read_new_blobs(
    space: Space,
    delta: Delta,
    known: Callable[[str], bool],
    written: Mapping[str, bytes] | None = None,
) -> dict[str, bytes]:
    """Fetch the bytes of every file in ``delta`` whose blob the log lacks: ``written``
    (sha256 -> bytes the caller itself just wrote) first, then all the rest in one
    ``read_files`` transfer, and alone only what that left out. Nothing is trusted
    unchecked: the scan named each file's sha256, and bytes are stored only under their
    own (a file changed between scan and read is stored as read, its entry updated, and
    the next scan sees the difference)."""
    blobs: dict[str, bytes] = {}
    wanted: dict[str, PathEntry] = {}
    for path, entry in delta.put.items():
        if entry.kind != "file" or entry.sha256 is None:
            continue
        sha = entry.sha256
        if sha in blobs or known(sha):
            continue
        if written is not None and sha in written:
            blobs[sha] = written[sha]  # its own content address: what the scan found
            continue
        wanted[path] = entry
    # Two paths with the same new content are read once (the second alone if the
    # first turned out to hold something else by the time it was read).
    first: dict[str, str] = {}
    for path, entry in wanted.items():
        first.setdefault(entry.sha256 or "", path)
    got = await space.read_files(sorted(first.values())) if first else {}
    for path in [*sorted(first.values()), *sorted(set(wanted) - set(first.values()))]:
        entry = wanted[path]
        if entry.sha256 in blobs:
            continue
        data = got[path] if path in got else await space.read_file(path)
        if blob_id(data) != entry.sha256:
            # The file changed between scan and read: store what we read under its own
            # id and let the caller's next scan see the difference.
            entry = PathEntry("file", entry.mode, len(data), blob_id(data))
            delta.put[path] = entry
        blobs[entry.sha256] = data  # type: ignore[index]
    return blobs


async def apply(
    space: Space,
    target: Mapping[str, PathEntry],
    blob: Callable[[str], bytes],
    exclude: Sequence[str] = (),
    *,
    epoch: int,
    guard: Callable[[PathTable], Awaitable[object]] | None = None,
) -> Delta:
    """Make the workspace equal to ``target``: write back what is missing or differs,
    delete what the image lacks. Returns what was changed. Every change carries
    ``epoch``: a driver paused here and continued after a takeover changes nothing more.
    ``guard`` is given the workspace as scanned before the first change (the quarantine
    keeps what nothing else holds: ``quarantine.py``)."""
    current = await space.scan(".", exclude)
    if guard is not None:
        await guard(current)
    d = diff(current, target)
    for p in d.delete:
        hit("image.apply_op")
        # An unsupported entry may stand for a whole tree (a bad directory name, a tree
        # too deep to scan): it goes whole.
        await space.remove(p, recursive=current[p].kind == "unsupported", epoch=epoch)
    # Files that replace a directory (or vice versa) need the old path gone first.
    for p, e in sorted(d.put.items()):
        hit("image.apply_op")  # a revert paused here must never resume after a takeover
        cur = current.get(p)
        if e.kind == "symlink":
            await space.symlink(p, e.target or "", epoch=epoch)
        elif cur is not None and cur.kind == "file" and cur.sha256 == e.sha256:
            await space.write_file(p, await space.read_file(p), e.mode, epoch=epoch)
        else:
            assert e.sha256 is not None
            await space.write_file(p, blob(e.sha256), e.mode, epoch=epoch)
    return d
