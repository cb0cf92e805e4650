"""Writing a report's files into a campaign directory someone else may have prepared."""

from __future__ import annotations

import os
from pathlib import Path


def write_file(path: Path, data: bytes) -> Path:
    """Write ``path`` whole: a fresh temporary file (``O_EXCL|O_NOFOLLOW``) renamed over it,
    so a reader never sees half a report and a symlink at ``path`` is replaced, not
    followed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
