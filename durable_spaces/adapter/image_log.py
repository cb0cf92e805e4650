"""The transactional image's log format: how a workspace's path table and its file
contents live in the log, and the adapter's reads and writes of them.

The path table is not rewritten whole per call (1000 files would cost ~190 KiB of log per
call). The rewindable document ``IMAGE_DOC`` holds a small pointer ``{"v": n, "full":
m}``; the table of version m is a document of its own, and versions m+1..n are deltas,
each a document written once. A new full table is written every ``FULL_EVERY`` versions
so reading never replays a long chain. Reading as of an entry reads the pointer as of
it; a fork finds chain documents in itself first, then in its ancestors (it writes its
own versions after the fork point, so a number it shares with its parent is always its
own). Each distinct blob is one write-once document, content-addressed.
"""

from __future__ import annotations

import base64
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable_spaces.adapter.image import Delta, diff, read_new_blobs
from durable_spaces.adapter.space_state import BLOB_DOC_PREFIX, IMAGE_DOC
from durable_spaces.errors import PermanentFailure
from durable_spaces.space import PathEntry, PathTable, Space

if TYPE_CHECKING:
    from durable_spaces.harness.handles import HarnessView
    from durable_spaces.harness.state import Tx


def decode_blob(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def encode_blob(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def table_from_json(d: Mapping[str, Mapping[str, object]] | None) -> PathTable:
    return {p: PathEntry.from_json(e) for p, e in (d or {}).items()}


def table_to_json(table: Mapping[str, PathEntry]) -> dict[str, dict[str, object]]:
    return {p: e.to_json() for p, e in sorted(table.items())}


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
    pointer: Mapping[str, object] | None,
    old: PathTable,
    new: PathTable,
    delta: Delta | None = None,
) -> tuple[dict[str, int], dict[str, object]]:
    """The pointer and the chain documents that record ``new`` after ``old``
    (``delta``: ``diff(old, new)`` when the caller has it already)."""
    prev = int(pointer["v"]) if pointer and "v" in pointer else 0  # type: ignore[call-overload]
    v = prev + 1
    if prev == 0 or v % FULL_EVERY == 1:
        return {"v": v, "full": v}, {full_doc(v): table_to_json(new)}
    assert pointer is not None
    d = delta if delta is not None else diff(old, new)
    return (
        {"v": v, "full": int(pointer["full"])},  # type: ignore[call-overload]
        {delta_doc(v): {"put": table_to_json(d.put), "delete": d.delete}},
    )


@dataclass(frozen=True)
class ImageUpdate:
    """What one commit adds to the image: the new pointer, its chain documents, blobs."""

    pointer: dict[str, int]
    chain: dict[str, object]
    blobs: dict[str, bytes]
    #: The path table this update makes the image.
    table: PathTable | None = None

    def write(self, tx: Tx, conv: str) -> None:
        for sha, data in self.blobs.items():
            tx.put_document(conv, BLOB_DOC_PREFIX + sha, encode_blob(data))
        for name, value in self.chain.items():
            tx.put_document(conv, name, value)
        tx.put_document(conv, IMAGE_DOC, self.pointer, rewindable=True)


def inherited(harness: HarnessView, conv: str, name: str) -> Any:
    """A write-once document of the conversation, else of its nearest ancestor (the
    committed value itself: callers only read it)."""
    cid: str | None = conv
    while cid is not None:
        c = harness.conversation(cid)
        value = c.document(name, copy=False)
        if value is not None:
            return value
        cid = c.parent_id
    return None


#: Tables read back, per harness, by (conversation, image version): a version is written
#: once, so its table never changes. Callers must not change a table they are given.
_tables: weakref.WeakKeyDictionary[Any, dict[tuple[str, int, int], PathTable]] = (
    weakref.WeakKeyDictionary()
)


def _version(pointer: Mapping[str, object] | None) -> tuple[int, int] | None:
    if not pointer or "v" not in pointer:
        return None
    return int(pointer["v"]), int(pointer["full"])  # type: ignore[call-overload]


def table(harness: HarnessView, conv: str, as_of: str | None = None) -> PathTable:
    """The image (path table) of a conversation, now or as of an entry (read once per
    version: the chain is replayed only for a version not seen yet)."""
    pointer = harness.conversation(conv).document(IMAGE_DOC, as_of=as_of, copy=False)
    version = _version(pointer)
    if version is None:
        return read_image(pointer, lambda name: inherited(harness, conv, name))
    cache = _tables.setdefault(harness, {})
    key = (conv, *version)
    found = cache.get(key)
    if found is None:
        found = cache[key] = read_image(pointer, lambda name: inherited(harness, conv, name))
    return found


def remember(harness: HarnessView, conv: str, image: ImageUpdate) -> None:
    """After ``image``'s commit: its table is known without reading the log back."""
    version = _version(image.pointer)
    if version is not None and image.table is not None:
        _tables.setdefault(harness, {})[(conv, *version)] = image.table


def has_blob(harness: HarnessView, conv: str, sha: str | None) -> bool:
    """Whether the log holds the blob ``sha`` (the conversation's or an ancestor's)."""
    return sha is not None and inherited(harness, conv, BLOB_DOC_PREFIX + sha) is not None


def blob(harness: HarnessView, conv: str, sha: str) -> bytes | None:
    """A blob of the image, looked up in the conversation and then its ancestors."""
    text = inherited(harness, conv, BLOB_DOC_PREFIX + sha)
    return None if text is None else decode_blob(text)


def need_blob(harness: HarnessView, conv: str) -> Callable[[str], bytes]:
    """Blob lookup for a restore of the image: a missing blob is a damaged log."""

    def get(sha: str) -> bytes:
        data = blob(harness, conv, sha)
        if data is None:
            raise PermanentFailure(f"the log's image refers to blob {sha} that it does not hold")
        return data

    return get


async def update(
    harness: HarnessView,
    conv: str,
    space: Space,
    new_table: PathTable,
    written: Mapping[str, bytes] | None = None,
) -> ImageUpdate | None:
    """What a commit must add so the image becomes ``new_table`` (None: nothing); the
    bytes of files whose blob the log lacks are read from the Space, unless ``written``
    (sha256 -> bytes the call itself wrote) has them."""
    old = table(harness, conv)
    delta = diff(old, new_table)
    if not delta:
        return None
    blobs = await read_new_blobs(
        space, delta, lambda sha: blob(harness, conv, sha) is not None, written
    )
    pointer = harness.conversation(conv).document(IMAGE_DOC, copy=False)
    new = delta.apply(old)
    new_pointer, chain = next_image(pointer, old, new, delta)
    return ImageUpdate(new_pointer, chain, blobs, new)
