"""mfusepy's ``FUSE`` entry, passing on what its libfuse3 wrappers drop.

mfusepy 3.1 calls ``rename(old, new)`` without the flags (RENAME_NOREPLACE must not become
a plain rename), and ``chmod``/``chown``/``utimens`` without the file handle (an unlinked
open file has no path for fchmod, fchown, futimens); its ``utimens`` also folds
UTIME_NOW/UTIME_OMIT into nanoseconds. These overrides hand ``ops.PowerOps`` all of it.
"""

from __future__ import annotations

from typing import Any

import mfusepy


def _fh(fip: Any) -> int | None:
    return int(fip.contents.fh) if fip else None


class PowerFUSE(mfusepy.FUSE):
    """Mounts and serves ``operations`` until unmounted (the constructor runs the loop)."""

    def _dec(self, path: bytes | None) -> str:
        return "" if path is None else path.decode(self.encoding, self.errors)

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return int(self.operations.rename(self._dec(old), self._dec(new), flags))

    def chmod_fuse_3(self, path: bytes | None, mode: int, fip: Any) -> int:
        return int(self.operations.chmod(self._dec(path), mode, _fh(fip)))

    def chown_fuse_3(self, path: bytes | None, uid: int, gid: int, fip: Any) -> int:
        uid = -1 if uid == 0xFFFFFFFF else uid
        gid = -1 if gid == 0xFFFFFFFF else gid
        return int(self.operations.chown(self._dec(path), uid, gid, _fh(fip)))

    def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
        times = None
        if buf:
            a, m = buf.contents.actime, buf.contents.modtime
            times = ((a.tv_sec, a.tv_nsec), (m.tv_sec, m.tv_nsec))
        return int(self.operations.utimens(self._dec(path), times, _fh(fip)))
