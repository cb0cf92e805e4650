"""The transactional image: the workspace as data in the log.

Why: a per-call checkpoint costs a tar of the whole workspace; the image costs only what
changed. The log holds a path table (path -> mode/size/sha256 or symlink target) as a
rewindable document, and each distinct blob once, content-addressed, as its own
document (written once, never changed). A call's diff is committed in the same
transaction as its outcome, so the image is always the workspace as of the last
committed call, and ``apply`` makes any workspace equal to it again.

Limits (``max_files``, ``max_bytes``) keep the log bounded; names with a backslash or a
newline are refused by the scan. Empty directories, owners and timestamps are not
tracked (as in the reference).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping, Sequence
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
        bad = sorted(p for p, e in table.items() if e.kind == "unsupported")
        if bad:
            shown = ", ".join(f"{p!r} ({table[p].target})" for p in bad[:3])
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            return f"the workspace holds what the image cannot represent: {shown}{more}"
        files = sum(1 for e in table.values() if e.kind == "file")
        size = sum(e.size for e in table.values() if e.kind == "file")
        if files > self.max_files:
            return f"workspace has {files} files, over max_files={self.max_files}"
        if size > self.max_bytes:
            return f"workspace holds {size} bytes, over max_bytes={self.max_bytes}"
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
    for p, e in new.items():
        if old.get(p) != e:
            d.put[p] = e
    d.delete = sorted(p for p in old if p not in new)
    return d


def table_to_json(table: Mapping[str, PathEntry]) -> dict[str, dict[str, object]]:
    return {p: e.to_json() for p, e in sorted(table.items())}


def table_from_json(d: Mapping[str, Mapping[str, object]] | None) -> PathTable:
    return {p: PathEntry.from_json(e) for p, e in (d or {}).items()}


def blob_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_blob(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode_blob(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


async def read_new_blobs(
    space: Space, delta: Delta, known: Callable[[str], bool]
) -> dict[str, bytes]:
    """Fetch the bytes of every file in ``delta`` whose blob the log lacks."""
    blobs: dict[str, bytes] = {}
    for path, entry in delta.put.items():
        if entry.kind != "file" or entry.sha256 is None:
            continue
        if entry.sha256 in blobs or known(entry.sha256):
            continue
        data = await space.read_file(path)
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
) -> Delta:
    """Make the workspace equal to ``target``: write back what is missing or differs,
    delete what the image lacks. Returns what was changed. Every change carries
    ``epoch``: a driver paused here and continued after a takeover changes nothing more."""
    current = await space.scan(".", exclude)
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


# --- the image in the log: a pointer, full tables and deltas ------------------------------
#
# The path table is not rewritten whole per call (1000 files would cost ~190 KiB of log per
# call). The rewindable document IMAGE_DOC holds a small pointer {"v": n, "full": m}; the
# table of version m is a document of its own, and versions m+1..n are deltas, each a
# document written once. A new full table is written every FULL_EVERY versions so reading
# never replays a long chain. Reading as of an entry reads the pointer as of it; a fork
# finds chain documents in itself first, then in its ancestors (it writes its own versions
# after the fork point, so a number it shares with its parent is always its own).

FULL_EVERY = 16


def full_doc(version: int) -> str:
    return f"cua.space.image/full/{version}"


def delta_doc(version: int) -> str:
    return f"cua.space.image/delta/{version}"


def read_image(pointer: Mapping[str, object] | None, lookup: Callable[[str], object]) -> PathTable:
    """The path table a pointer names (``lookup`` finds a chain document by name)."""
    if not pointer:
        return {}
    if "v" not in pointer:  # a plain table
        return table_from_json(pointer)  # type: ignore[arg-type]
    v, full = int(pointer["v"]), int(pointer["full"])  # type: ignore[call-overload]
    base = lookup(full_doc(full))
    if base is None:
        raise KeyError(f"the image's full table {full} is missing from the log")
    table = table_from_json(base)  # type: ignore[arg-type]
    for k in range(full + 1, v + 1):
        d = lookup(delta_doc(k))
        if d is None:
            raise KeyError(f"the image's delta {k} is missing from the log")
        delta = Delta(table_from_json(d["put"]), list(d["delete"]))  # type: ignore[index]
        table = delta.apply(table)
    return table


def next_image(
    pointer: Mapping[str, object] | None, old: PathTable, new: PathTable
) -> tuple[dict[str, int], dict[str, object]]:
    """The pointer and the chain documents that record ``new`` after ``old``."""
    prev = int(pointer["v"]) if pointer and "v" in pointer else 0  # type: ignore[call-overload]
    v = prev + 1
    if prev == 0 or v % FULL_EVERY == 1:
        return {"v": v, "full": v}, {full_doc(v): table_to_json(new)}
    assert pointer is not None
    d = diff(old, new)
    return (
        {"v": v, "full": int(pointer["full"])},  # type: ignore[call-overload]
        {delta_doc(v): {"put": table_to_json(d.put), "delete": d.delete}},
    )
