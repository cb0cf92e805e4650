"""The manifest of an incremental workspace checkpoint: the workspace as a path table.

Why: a tar of the whole workspace per call costs what the workspace weighs; a manifest
(every path's kind, mode, size, mtime and the sha256 of its bytes, or a link's target)
plus the blobs no earlier checkpoint stored costs what changed. Blobs are named by the
sha256 of their bytes (``image.blob_id``, the transactional image's blob ids), so any
copy of one is checked by hashing it.

A manifest is canonical JSON (entries sorted by their path's bytes), so its sha256 names
it (``checkpoints.ids.CheckpointId.for_manifest``) and the same tree gives the same id. It
is read back from stores and Spaces a crash, a bug or an agent can damage, so ``decode``
trusts nothing: every path is relative and normalised, under a directory entry of the
manifest (never under a symlink or a file), hard links name an earlier file, kinds,
modes, sizes and digests are what they must be. Anything else is ``ManifestError``.

Directories (empty ones too) and their modes are kept; owners are not (a restore runs
with ``--no-same-owner``); FIFOs, sockets and devices never get in. Names are
``os.fsdecode``-style strings (``surrogateescape``), so any byte name round-trips.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from durable_spaces.adapter.image import blob_id
from durable_spaces.host.bounded import parse_json

FORMAT = "durable-spaces.manifest"
VERSION = 1
ROOT = "."

FILE, DIR, SYMLINK, HARDLINK = "f", "d", "l", "h"
KINDS = (FILE, DIR, SYMLINK, HARDLINK)

#: A blob's name (its sha256, hex): the only names a copy's or a store's blobs dir holds
#: for us, and the only ones a prune deletes.
BLOB_NAME = re.compile(r"[0-9a-f]{64}")


def blob_names(dir_fd: int) -> set[str]:
    """The blob names in the directory open at ``dir_fd`` (any other name is not ours)."""
    return {n for n in os.listdir(dir_fd) if BLOB_NAME.fullmatch(n)}


class ManifestError(ValueError):
    """A manifest that does not parse, or names what no restore may write."""


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One path: ``ref`` is the blob's sha256 (files), the target (symlinks) or the
    earlier path it is a hard link of; ``mode`` is the permission bits (0o7777)."""

    kind: str
    mode: int = 0o644
    size: int = 0
    ref: str | None = None
    mtime_ns: int = 0


#: A manifest: path -> entry (``ROOT`` is the workspace directory itself).
Manifest = dict[str, ManifestEntry]


def path_key(path: str) -> bytes:
    """The order of a manifest's entries (and of a restore's members): by the bytes of
    the name, so a directory comes before what is in it."""
    return path.encode("utf-8", "surrogateescape")


def encode(m: Mapping[str, ManifestEntry]) -> bytes:
    """The canonical bytes of ``m`` (what its id's digest is taken of)."""
    rows = [
        [p, e.kind, e.mode, e.size, e.ref, e.mtime_ns]
        for p, e in sorted(m.items(), key=lambda pe: path_key(pe[0]))
    ]
    doc = {"format": FORMAT, "version": VERSION, "entries": rows}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode("ascii")


class Encoder:
    """``encode``, byte for byte, for a caller that encodes one workspace again and
    again: each row's JSON is kept by (path, entry), so only changed rows are encoded
    (most of a 1000-file manifest's encoding time was the rows that did not change);
    with ``changed`` (the paths whose entry may differ from the last call's), only those
    rows are even looked at, while the set of paths stays the same."""

    _HEAD = f'{{"format":{json.dumps(FORMAT)},"version":{json.dumps(VERSION)},"entries":['

    def __init__(self) -> None:
        self._rows: dict[str, tuple[ManifestEntry, str]] = {}
        self._paths: frozenset[str] = frozenset()
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self._out: list[str] | None = None

    def encode(
        self, m: Mapping[str, ManifestEntry], changed: AbstractSet[str] | None = None
    ) -> bytes:
        out = self._out
        if changed is not None and out is not None and m.keys() == self._paths:
            for p in changed:
                out[self._index[p]] = self._row(p, m[p])
            return (self._HEAD + ",".join(out) + "]}").encode("ascii")
        rows = self._rows
        self._rows = {}
        if m.keys() != self._paths:  # the same paths: the same order
            self._paths, self._order = frozenset(m), sorted(m, key=path_key)
            self._index = {p: i for i, p in enumerate(self._order)}
        out = self._out = [self._row(p, m[p], rows) for p in self._order]
        return (self._HEAD + ",".join(out) + "]}").encode("ascii")

    def _row(
        self, p: str, e: ManifestEntry, rows: dict[str, tuple[ManifestEntry, str]] | None = None
    ) -> str:
        known = (self._rows if rows is None else rows).get(p)
        if known is None or (known[0] is not e and known[0] != e):
            row = [p, e.kind, e.mode, e.size, e.ref, e.mtime_ns]
            known = (e, json.dumps(row, separators=(",", ":"), ensure_ascii=True))
        self._rows[p] = known
        return known[1]


def contents(m: Mapping[str, ManifestEntry]) -> dict[str, tuple[str, str | None]]:
    """What each path of the workspace holds, as a scan's table says it
    (``quarantine.content``): ``("file", sha256)`` (a hard link: its file's) or
    ``("symlink", target)``; directories hold nothing of their own."""
    out: dict[str, tuple[str, str | None]] = {}
    for path, e in m.items():
        if e.kind == FILE:
            out[path] = ("file", e.ref)
        elif e.kind == SYMLINK:
            out[path] = ("symlink", e.ref)
        elif e.kind == HARDLINK and e.ref is not None and e.ref in m:
            out[path] = ("file", m[e.ref].ref)
    return out


def blobs(m: Mapping[str, ManifestEntry]) -> set[str]:
    """The blobs a restore of ``m`` needs."""
    return {e.ref for e in m.values() if e.kind == FILE and e.ref is not None}


def decode(data: bytes) -> Manifest:
    """The manifest ``data`` holds, checked whole (``ManifestError`` says what is wrong)."""
    try:
        # As deep as the parser goes, no walk after: a restore reads every row anyway, and
        # the rows' check below refuses anything nested in them (a walk cost more than the parse).
        doc = parse_json(data.decode("ascii"), where="a manifest", max_depth=None)
    except (UnicodeDecodeError, ValueError) as e:
        raise ManifestError(f"not a manifest: {str(e)[:120]}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError("not a manifest (no format marker)")
    if doc.get("version") != VERSION:
        raise ManifestError(f"manifest version {str(doc.get('version'))[:20]!r} is not {VERSION}")
    rows = doc.get("entries")
    if not isinstance(rows, list):
        raise ManifestError("manifest entries are not a list")
    out: Manifest = {}
    last = b""
    for row in rows:
        path, entry = _row(row)
        key = path_key(path)
        if out and key <= last:
            raise ManifestError(f"manifest entries out of order or repeated at {path[:200]!r}")
        last = key
        _check_place(out, path, entry)
        out[path] = entry
    if ROOT not in out:
        raise ManifestError("manifest has no entry for the workspace directory")
    return out


def _row(row: object) -> tuple[str, ManifestEntry]:
    if not isinstance(row, list) or len(row) != 6:
        raise ManifestError(f"manifest entry is not a 6-item list: {str(row)[:120]}")
    path, kind, mode, size, ref, mtime = row
    if not isinstance(path, str) or kind not in KINDS:
        raise ManifestError(f"manifest entry has a bad path or kind: {str(row)[:120]}")
    for name, v in (("mode", mode), ("size", size), ("mtime", mtime)):
        # A time before 1970 is negative, and a file can have one (``touch -d @-1``).
        if type(v) is not int or (v < 0 and name != "mtime"):
            raise ManifestError(f"manifest entry {path[:200]!r}: bad {name} {str(v)[:40]}")
    if mode > 0o7777:
        raise ManifestError(f"manifest entry {path[:200]!r}: mode {mode:o} is not permission bits")
    _check_path(path)
    if kind == FILE:
        if not isinstance(ref, str) or not BLOB_NAME.fullmatch(ref):
            raise ManifestError(f"manifest entry {path[:200]!r}: bad sha256 {str(ref)[:80]!r}")
    elif kind in (SYMLINK, HARDLINK):
        if not isinstance(ref, str) or not ref or "\0" in ref:
            raise ManifestError(f"manifest entry {path[:200]!r}: bad target {str(ref)[:80]!r}")
    elif ref is not None:
        raise ManifestError(f"manifest entry {path[:200]!r}: a directory with a reference")
    return path, ManifestEntry(kind, mode, size, ref, mtime)


def _check_path(path: str) -> None:
    if path == ROOT:
        return
    bad = (
        not path
        or "\0" in path
        or path.startswith("/")
        or any(part in ("", ".", "..") for part in path.split("/"))
    )
    if bad:
        raise ManifestError(f"manifest path escapes or is not normalised: {path[:200]!r}")
    try:
        path_key(path)
    except UnicodeEncodeError:
        raise ManifestError(f"manifest path is not a file name: {path[:200]!r}") from None


def _check_place(seen: Manifest, path: str, e: ManifestEntry) -> None:
    """Where ``path`` lands must be a directory of the manifest; a hard link's target an
    earlier file."""
    if path == ROOT:
        if e.kind != DIR:
            raise ManifestError("the workspace entry of a manifest is not a directory")
        return
    parent = path.rpartition("/")[0] or ROOT
    if seen.get(parent, ManifestEntry(FILE)).kind != DIR:
        raise ManifestError(f"manifest path {path[:200]!r} is not under a directory of it")
    if e.kind == HARDLINK:
        assert e.ref is not None
        target = seen.get(e.ref)
        if target is None or target.kind != FILE:
            raise ManifestError(
                f"manifest hard link {path[:200]!r} names no earlier file ({e.ref[:200]!r})"
            )


def to_tar(m: Mapping[str, ManifestEntry], blob: Callable[[str], bytes]) -> bytes:
    """A tar of the workspace ``m`` describes (pax; the root as ``.``), for a restore to
    extract. ``blob(sha)`` gives a blob's verified bytes; a blob of the wrong length or
    digest is ``ManifestError`` (never archived)."""
    buf = io.BytesIO()
    with tarfile.open(
        fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, errors="surrogateescape"
    ) as tar:
        for path, e in sorted(m.items(), key=lambda pe: path_key(pe[0])):
            info = tarfile.TarInfo(path)
            info.mode, info.mtime = e.mode, e.mtime_ns / 1e9
            data: bytes | None = None
            if e.kind == DIR:
                info.type = tarfile.DIRTYPE
            elif e.kind == SYMLINK:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.ref or "", 0o777
            elif e.kind == HARDLINK:
                info.type, info.linkname = tarfile.LNKTYPE, e.ref or ""
            else:
                assert e.ref is not None
                data = blob(e.ref)
                if len(data) != e.size or blob_id(data) != e.ref:
                    raise ManifestError(f"blob {e.ref} does not hold {path[:200]!r}")
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def summary(m: Mapping[str, ManifestEntry]) -> str:
    """How big ``m`` is, for messages."""
    files = sum(1 for e in m.values() if e.kind == FILE)
    return f"{len(m)} entries, {files} files, {len(blobs(m))} blobs"


def ordered(paths: Iterable[str]) -> list[str]:
    return sorted(paths, key=path_key)
