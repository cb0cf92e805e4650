"""What a power cut does to the image: the volatile state is dropped, and (optionally) the
last unsynced write of each file is torn at a sector boundary.

Dropping needs no work here: the image already is the durable state, and the next boot
copies it afresh into the live tree. Tearing writes a prefix of that last write into the
image: it models a write the disk was part-way through when the power went.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # ops loads libfuse; boundary() must work without it
    from durable_spaces.chaos.powerfs.ops import PowerOps

SECTOR = 512


def boundary(seed: int | str, cut: int, path: str, offset: int, length: int) -> int:
    """The file offset up to which a torn write reached the disk: the write's start or a
    512-byte boundary strictly inside it, drawn from ``random.Random`` seeded by the mount's
    seed, the cut's number and the write itself (so the draw does not depend on the order
    files are visited, and the same run tears the same way)."""
    last = (offset + length - 1) // SECTOR
    choices = [offset] + [m * SECTOR for m in range(offset // SECTOR + 1, last + 1)]
    return random.Random(f"{seed}/{cut}/{path}/{offset}/{length}").choice(choices)


def power_cut(ops: PowerOps, *, seed: int | str, tear: bool, cut: int) -> dict[str, Any]:
    """Report what this cut drops and apply the tears. The caller holds ``ops.mutex`` and
    ends the process right after, so nothing else changes the image meanwhile."""
    totals = ops.volatile.totals()
    torn = []
    if tear:
        for ino, pending in ops.volatile.items():
            node = ops.image.by_live.get(ino)
            if pending.last_write is None or node is None or node.kind != "file":
                continue
            if not node.names:  # an orphan: gone at the next boot anyway
                continue
            offset, data = pending.last_write
            rel = ops.image.relpath(node)
            kept = boundary(seed, cut, rel, offset, len(data)) - offset
            ops.image.tear(node, offset, data[:kept])
            torn.append({"path": rel, "offset": offset, "length": len(data), "kept": kept})
    torn.sort(key=lambda t: (t["path"], t["offset"]))
    return {
        "cut": cut,
        "ops": totals["pending_ops"],
        "bytes": totals["pending_bytes"],
        "inodes": totals["pending_inodes"],
        "torn": torn,
    }
