"""The incremental scan of a daemon-backed Space, without the I/O: a ``find`` listing with
stat keys read into a path table, and the hash cache that makes the next scan hash only
what changed.

The Space runs two helper commands per scan: ``LIST_ARGV`` (the listing, after the
Space's clock) and, for the files whose (size, mtime, inode, ctime) changed since the
last scan, ``HASH_ARGV`` fed ``hash_input(names)``. As in ``local_fs``, a file touched
within ``RACY_SECONDS`` of the scan is not cached (a same-tick rewrite looks unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from durable_spaces.space import (
    MAX_SCAN_DEPTH,
    PathEntry,
    PathTable,
    name_problem,
    unsupported,
)

#: Timestamps this close to a scan's start are not trusted for caching (as local_fs).
RACY_SECONDS = 0.05

_FORMAT = r"%y\0%P\0%m\0%s\0%i\0%T@\0%C@\0%l\0"
_LIST = 'date +%s.%N && exec find . "(" -type f -o -type l ")" -printf "$1"'
#: The listing, run in the scanned directory: the Space's clock, then 8 fields a path.
LIST_ARGV = ("sh", "-c", _LIST, "sh", _FORMAT)
#: The hashes of the NUL-separated names on stdin, run in the workspace.
HASH_ARGV = ("xargs", "-0", "-r", "sha256sum", "-z", "--")


@dataclass
class Listing:
    """A scan half done: the table from the listing, and the files still to hash."""

    top: str
    table: PathTable
    #: rel -> (stat key, cacheable)
    sigs: dict[str, tuple[str, bool]] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)


class ScanCache:
    """The hash cache of one Space object, and its counters (as ``local_fs.Scanner``:
    ``hashed`` counts files read, cumulative; ``files`` the entries of the last scan)."""

    def __init__(self) -> None:
        self._hashes: dict[str, tuple[str, str]] = {}  # rel -> (stat key, sha256)
        self.stats: dict[str, int] = {"hashed": 0, "scans": 0, "files": 0}

    def listing(self, top: str, out: bytes, exclude: list[str]) -> Listing:
        """Read the output of ``LIST_ARGV`` run in ``top`` (workspace-relative), leaving
        out the workspace paths ``exclude`` and what is under them."""
        prefix = "" if top == "." else top + "/"
        now_line, _, listing = out.partition(b"\n")
        racy_after = float(now_line) - RACY_SECONDS
        fields = listing.split(b"\0")
        result = Listing(top, {})
        table = result.table
        for i in range(0, len(fields) - 7, 8):
            typ, name_b, mode, size, ino, mtime, ctime, target = fields[i : i + 8]
            name = prefix + name_b.decode("utf-8", "surrogateescape")
            if excluded(name, exclude):
                continue
            cut = unrepresentable(name)
            if cut is not None:  # as local_fs: one entry where the image stops
                table[cut[0]] = unsupported(cut[1])
                continue
            if typ == b"l":
                tgt = target.decode("utf-8", "surrogateescape")
                table[name] = PathEntry(kind="symlink", mode=0o777, target=tgt)
                continue
            table[name] = PathEntry(kind="file", mode=int(mode, 8) & 0o777, size=int(size))
            key = b"|".join((size, ino, mtime, ctime)).decode()
            result.sigs[name] = (key, max(float(mtime), float(ctime)) < racy_after)
        result.stale = [
            n for n, (k, _) in result.sigs.items() if self._hashes.get(n, ("", ""))[0] != k
        ]
        return result

    def table(self, listing: Listing, hashes: dict[str, str]) -> PathTable:
        """The finished table, given the hashes of ``listing.stale``; updates the cache."""
        table = listing.table
        fresh: dict[str, tuple[str, str]] = {}
        for name, (key, cacheable) in listing.sigs.items():
            sha = hashes[name] if name in hashes else self._hashes.get(name, ("", ""))[1]
            if name in listing.stale and name not in hashes:  # gone between find and hash
                del table[name]
                continue
            if cacheable:
                fresh[name] = (key, sha)
            e = table[name]
            table[name] = PathEntry(kind="file", mode=e.mode, size=e.size, sha256=sha)
        if listing.top == ".":
            self._hashes = fresh
        else:
            prefix = listing.top + "/"
            for k in [k for k in self._hashes if k.startswith(prefix)]:
                del self._hashes[k]
            self._hashes.update(fresh)
        self.stats["hashed"] += len(listing.stale)
        self.stats["scans"] += 1
        self.stats["files"] = len(table)
        return table


def excluded(name: str, exclude: Sequence[str]) -> bool:
    """Whether the workspace path ``name`` is one of ``exclude`` or under one."""
    return any(name == x or name.startswith(x + "/") for x in exclude)


def table_of(
    entries: Mapping[str, PathEntry],
    top: str,
    exclude: Sequence[str],
    cuts: Mapping[str, tuple[str, str]],
) -> PathTable:
    """The table a scan of ``top`` leaving out ``exclude`` gives, from ``entries`` of the
    whole workspace (``guest_journal``), as ``ScanCache.listing`` builds it from a
    listing; ``cuts`` holds ``unrepresentable`` of the names it is not None for."""
    if top == "." and not exclude and not cuts:
        return dict(entries)
    prefix = "" if top == "." else top + "/"
    table: PathTable = {}
    for name, e in entries.items():
        if not name.startswith(prefix) or excluded(name, exclude):
            continue
        cut = cuts.get(name)
        if cut is not None:
            table[cut[0]] = unsupported(cut[1])
            continue
        table[name] = e
    return table


def hash_input(names: list[str]) -> bytes:
    """The stdin of ``HASH_ARGV`` for ``names``."""
    return b"\0".join(n.encode("utf-8", "surrogateescape") for n in names) + b"\0"


def parse_hashes(out: bytes) -> dict[str, str]:
    """The output of ``HASH_ARGV``: name -> sha256."""
    hashes: dict[str, str] = {}
    for rec in out.split(b"\0"):
        if len(rec) > 66:
            hashes[rec[66:].decode("utf-8", "surrogateescape")] = rec[:64].decode()
    return hashes


def unrepresentable(name: str) -> tuple[str, str] | None:
    """Where a listed path leaves what the image can hold (a bad name, too deep): the
    path up to there and why; None when all of it is representable."""
    parts = name.split("/")
    for i, part in enumerate(parts):
        if i >= MAX_SCAN_DEPTH:
            return "/".join(parts[:MAX_SCAN_DEPTH]), f"deeper than {MAX_SCAN_DEPTH} levels"
        why = name_problem(part)
        if why is not None:
            return "/".join(parts[: i + 1]), why
    return None
