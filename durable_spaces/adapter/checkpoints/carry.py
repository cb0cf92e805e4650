"""The small blobs a store's manifest file carries after the manifest itself, so that a
checkpoint is durable with one fsync of one file (``checkpoints.batch``).

Why: a checkpoint of 10 changed files wrote 11 files and fsynced each, then two
directories; on one host the twelve fsyncs (at once) took 1.2-1.5 ms of a 5 ms
checkpoint. A manifest file that also holds the bytes of the small blobs it adds is the
one durable copy those need: their own files in ``blobs/`` are then written without a
fsync, as the fast path readers use, and put in place only after the manifest is
durable, so a blob file a later checkpoint finds (and does not carry again) always has a
carrier on disk. A reader that finds a blob file missing or damaged (a power cut took
its unsynced bytes) reads it from its carrier; a carrier is removed or replaced only
after the blobs it carries are synced in ``blobs/`` (``DirectoryCheckpointStore``'s
``prune``, ``delete`` and a manifest written over it).

The file: the manifest's bytes, then one entry per carried blob (its sha256, 32 bytes;
its length, 8 bytes big-endian; its bytes), then the footer ``FOOTER``: ``MAGIC``, the
manifest's length, the number of entries. A file that does not end in a footer whose
entries fill it exactly is a manifest with nothing carried (every manifest an older
adapter wrote). Nothing here is trusted: a manifest still has to match its id, a carried
blob its sha256.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import struct
from collections.abc import Callable, Iterable

__all__ = [
    "CARRY_MAX",
    "FOOTER",
    "MAGIC",
    "carried",
    "entries",
    "find",
    "intact",
    "split",
    "trailer",
    "walk",
]

MAGIC = b"DS-CARRY"
FOOTER = struct.Struct(">8sQQ")  # magic, manifest length, entries
_ENTRY = struct.Struct(">32sQ")  # sha256, length
#: At most this many bytes of blobs carried per manifest (the rest synced on their own):
#: a first checkpoint of a large tree does not hold the tree in memory twice.
CARRY_MAX = 8 << 20


def trailer(manifest_len: int, blobs: Iterable[tuple[str, bytes]]) -> bytes:
    """What follows a manifest of ``manifest_len`` bytes that carries ``blobs``."""
    parts = []
    n = 0
    for sha, data in blobs:
        parts += [_ENTRY.pack(bytes.fromhex(sha), len(data)), data]
        n += 1
    return b"".join([*parts, FOOTER.pack(MAGIC, manifest_len, n)])


def entries(data: bytes) -> tuple[int, dict[str, tuple[int, int]]] | None:
    """(the manifest's length, sha -> (offset, length) of each carried blob) of a whole
    file; None when it does not end in a footer its entries fill exactly."""
    return walk(len(data), lambda at, n: data[at : at + n])


def walk(
    size: int, read: Callable[[int, int], bytes]
) -> tuple[int, dict[str, tuple[int, int]]] | None:
    """``entries`` of a file of ``size`` bytes read by ``read(offset, n)`` (a ``pread``
    reads only the footer and the entries' headers, not the blobs)."""
    end = size - FOOTER.size
    if end < 0:
        return None
    footer = read(end, FOOTER.size)
    if len(footer) != FOOTER.size:
        return None
    magic, mlen, count = FOOTER.unpack(footer)
    # Each entry takes at least its header: a count past that is refused before the walk
    # (a planted file cannot make a reader loop over more headers than the file holds).
    if magic != MAGIC or mlen > end or count > (end - mlen) // _ENTRY.size:
        return None
    found: dict[str, tuple[int, int]] = {}
    at = mlen
    for _ in range(count):
        head = read(at, _ENTRY.size) if at + _ENTRY.size <= end else b""
        if len(head) != _ENTRY.size:
            return None
        raw, length = _ENTRY.unpack(head)
        at += _ENTRY.size
        if length > end - at:
            return None
        found[raw.hex()] = (at, length)
        at += length
    return (mlen, found) if at == end else None


def split(data: bytes) -> bytes:
    """The manifest of a store's manifest file (all of it when nothing is carried)."""
    parsed = entries(data)
    return data if parsed is None else data[: parsed[0]]


def intact(data: bytes) -> dict[str, bytes]:
    """Every blob the file ``data`` carries whose bytes match its sha256 (one parse)."""
    parsed = entries(data)
    found: dict[str, bytes] = {}
    for sha, (at, length) in (parsed[1] if parsed is not None else {}).items():
        blob = data[at : at + length]
        if hashlib.sha256(blob).hexdigest() == sha:
            found[sha] = blob
    return found


def carried(data: bytes, sha: str) -> bytes | None:
    """Blob ``sha`` as the file ``data`` carries it, if intact; else None."""
    return intact(data).get(sha)


def find(dfd: int, names: Iterable[str], sha: str) -> tuple[bytes, str] | None:
    """Blob ``sha`` intact from the first of the files ``names`` (in the directory
    ``dfd``, regular files only, never followed) that carries it, and that file's name.
    Of the others only footers and entry headers are read."""
    for name in names:
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
            )
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            parsed = walk(st.st_size, functools.partial(_pread, fd))
            if parsed is None or sha not in parsed[1]:
                continue
            at, length = parsed[1][sha]
            blob = os.pread(fd, length, at)
            if hashlib.sha256(blob).hexdigest() == sha:
                return blob, name
        except OSError:
            continue
        finally:
            os.close(fd)
    return None


def _pread(fd: int, at: int, n: int) -> bytes:
    return os.pread(fd, n, at)
