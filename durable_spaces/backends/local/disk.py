"""How a ``local`` Space's state lands on disk: atomic replacement with fsyncs (a crash
leaves the old file or the new), and the tolerant reads of a command's files (a file a
dying writer never finished reads as missing)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from durable_spaces.host.bounded import load_object
from durable_spaces.host.files import fsync_dir
from durable_spaces.space import OUTPUT_TAIL_BYTES


def write_atomic(path: Path, data: bytes, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` by a rename (fsynced, with its directory, unless
    ``fsync`` is False: a file whose loss a crash makes true anyway)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.rename(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing or torn."""
    try:
        return load_object(path)
    except (FileNotFoundError, ValueError):  # a FIFO, too big, too deep: ValueError too
        return None


def tail(path: Path, n: int = OUTPUT_TAIL_BYTES) -> bytes:
    """The last ``n`` bytes of ``path`` (empty when it is missing)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - n))
            return f.read(n)
    except FileNotFoundError:
        return b""
