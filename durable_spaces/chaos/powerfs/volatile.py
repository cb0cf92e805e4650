"""What a power cut would lose: the changes each live inode got since its last fsync.

Only bookkeeping lives here (no I/O): the byte ranges written, the smallest size a truncate
set, the last write itself (for tearing), and counters for ``stats()``. The bytes are in
the live tree; ``image.Image.sync_file`` copies the ranges listed here.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class Pending:
    """One inode's unsynced changes."""

    starts: list[int] = field(default_factory=list)  # sorted, disjoint [start, end) ranges
    ends: list[int] = field(default_factory=list)
    floor: int | None = None  # the smallest size a truncate set since the last sync
    last_write: tuple[int, bytes] | None = None  # offset and data of the newest write
    data_ops: int = 0  # writes and truncates
    meta_ops: int = 0  # chmod, chown, utimens
    dir_ops: int = 0  # entry changes (this inode is a directory)

    def add_range(self, start: int, end: int) -> None:
        """Merge [start, end) into the ranges (touching ranges coalesce)."""
        if end <= start:
            return
        i = bisect.bisect_left(self.ends, start)
        j = bisect.bisect_right(self.starts, end)
        if i < j:
            start = min(start, self.starts[i])
            end = max(end, self.ends[j - 1])
        self.starts[i:j] = [start]
        self.ends[i:j] = [end]

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.ends, strict=True))

    @property
    def dirty_bytes(self) -> int:
        return sum(e - s for s, e in zip(self.starts, self.ends, strict=True))

    @property
    def ops(self) -> int:
        return self.data_ops + self.meta_ops + self.dir_ops


class Volatile:
    """Pending changes by live inode number."""

    def __init__(self) -> None:
        self._by_ino: dict[int, Pending] = {}

    def get(self, ino: int) -> Pending:
        """The inode's pending changes (an empty record when it has none)."""
        return self._by_ino.get(ino) or Pending()

    def _of(self, ino: int) -> Pending:
        return self._by_ino.setdefault(ino, Pending())

    def wrote(self, ino: int, offset: int, data: bytes) -> None:
        p = self._of(ino)
        p.add_range(offset, offset + len(data))
        p.last_write = (offset, data) if data else p.last_write
        p.data_ops += 1

    def truncated(self, ino: int, size: int) -> None:
        p = self._of(ino)
        p.floor = size if p.floor is None else min(p.floor, size)
        p.last_write = None  # a truncate after the write: nothing left to tear
        p.data_ops += 1

    def extended(self, ino: int) -> None:
        """fallocate: the size may grow (zeros), no data changes."""
        self._of(ino).data_ops += 1

    def meta(self, ino: int) -> None:
        self._of(ino).meta_ops += 1

    def dir_changed(self, ino: int) -> None:
        self._of(ino).dir_ops += 1

    def synced_data(self, ino: int, *, with_meta: bool) -> None:
        """fdatasync (``with_meta=False``) or fsync of a file: its data is durable."""
        p = self._by_ino.get(ino)
        if p is None:
            return
        p.starts, p.ends, p.floor, p.last_write, p.data_ops = [], [], None, None, 0
        if with_meta:
            p.meta_ops = 0
        self._drop_if_empty(ino, p)

    def synced_dir(self, ino: int, *, with_meta: bool) -> None:
        p = self._by_ino.get(ino)
        if p is None:
            return
        p.dir_ops = 0
        if with_meta:
            p.meta_ops = 0
        self._drop_if_empty(ino, p)

    def forget(self, ino: int) -> None:
        """A new inode got this number: whatever was recorded belonged to a dead one."""
        self._by_ino.pop(ino, None)

    def _drop_if_empty(self, ino: int, p: Pending) -> None:
        if not p.ops and not p.starts and p.floor is None:
            del self._by_ino[ino]

    def items(self) -> list[tuple[int, Pending]]:
        return sorted(self._by_ino.items())

    def totals(self) -> dict[str, int]:
        """Pending ops, dirty bytes and inodes with anything pending."""
        return {
            "pending_ops": sum(p.ops for p in self._by_ino.values()),
            "pending_bytes": sum(p.dirty_bytes for p in self._by_ino.values()),
            "pending_inodes": len(self._by_ino),
        }
