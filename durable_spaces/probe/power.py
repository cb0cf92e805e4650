"""The ``power`` fault's disk: the harness's state directory on a powerfs mount.

Under ``--fault power`` a run's ``{state_dir}`` (where a recipe tells its harness to keep
its durable log) is a powerfs mount (``durable_spaces/chaos/powerfs``) over a backing
directory beside it: the harness sees its writes at once, but only what it made durable
(an ``fsync`` of the file, of the directory for a new name) is in the backing directory.
At the kill point the lab kills everything the run started, then cuts the power: every
unsynced write and directory entry of the state directory is dropped, and the mount comes
back on the durable state, where the resumed harness finds its log. The workspace is not
on the mount (its effects are what the checker counts, as under the other faults).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from durable_spaces.campaigns.capabilities import CAPABILITIES
from durable_spaces.chaos.powerfs import PowerFS, PowerFSError, mount

__all__ = ["StateDisk", "power_unavailable"]


def power_unavailable() -> str | None:
    """Why this machine cannot make the power fault (one line), or None."""
    why = CAPABILITIES["fuse"].missing()
    return None if why is None else f"the power fault needs powerfs: {why}"


class StateDisk:
    """One run's state directory on powerfs; ``cut()`` is the power loss."""

    def __init__(self, state: Path, backing: Path, seed: str) -> None:
        backing.mkdir(parents=True, exist_ok=True)
        self.fs: PowerFS | None = mount(backing, state, seed=seed)
        self.cuts: list[dict[str, Any]] = []

    def cut(self) -> dict[str, Any]:
        """Drop the state directory's unsynced writes; what was dropped."""
        assert self.fs is not None
        r = self.fs.cut()
        out = {"ops": r.ops, "bytes": r.bytes, "inodes": r.inodes}
        self.cuts.append(out)
        return out

    def close(self) -> None:
        """Unmount (what is volatile then no longer matters: the run is over)."""
        fs, self.fs = self.fs, None
        if fs is not None:
            with contextlib.suppress(PowerFSError):
                fs.unmount(sync=False)
