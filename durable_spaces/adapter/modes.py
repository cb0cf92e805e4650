"""Which way a conversation's Space is kept consistent with the log.

Two mechanisms, because neither is free. *checkpoint* (a tar of the workspace, or the
whole machine, after every call) captures anything, including processes when the
machine is checkpointed, but costs a copy of the workspace per call. *transactional*
keeps a content-addressed image of the workspace in the log and costs only what changed,
but cannot capture processes or huge trees. *auto* (the default) runs transactional
while it is sound and switches to checkpoint, for good, the first time it is not: a
process left running, a workspace over the limits, a machine-checkpoint provider, missing
tooling, or a conversation that already has checkpoints. Switching back is never done: a
conversation's history would then mix two kinds of truth.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

from durable_spaces.adapter.image import ImageLimits
from durable_spaces.space import Capabilities, PathTable, Space

Mode = Literal["auto", "transactional", "checkpoint"]

CONTAINER_LIKE = frozenset({"local", "process", "container", "gvisor"})
TOOLING = ("find", "stat", "xargs", "sha256sum", "tar")


@dataclass(frozen=True)
class Verdict:
    """Whether transactional mode may continue, and if not why."""

    transactional: bool
    reason: str | None = None


def kind_allows(caps: Capabilities, whole_machine_snapshots: bool) -> Verdict:
    if caps.kind in CONTAINER_LIKE or not whole_machine_snapshots:
        return Verdict(True)
    return Verdict(False, f"Space kind {caps.kind!r} with whole-machine checkpoints")


def limits_allow(table: PathTable, limits: ImageLimits) -> Verdict:
    why = limits.violation(table)
    return Verdict(why is None, why)


async def tooling_present(space: Space, epoch: int) -> Verdict:
    script = " && ".join(f"command -v {t} >/dev/null" for t in TOOLING)
    res = await space.exec(["bash", "-c", script], key=None, epoch=epoch, cwd="/")
    if res.exit_code == 0:
        return Verdict(True)
    return Verdict(False, f"tooling missing in the Space (needs {', '.join(TOOLING)})")


async def processes_in_workspace(space: Space, epoch: int) -> list[int]:
    """Pids whose cwd is inside the workspace (read from /proc in the Space)."""
    root = space.root.rstrip("/")
    script = (
        'for d in /proc/[0-9]*; do c=$(readlink "$d/cwd" 2>/dev/null) || continue; '
        f'case "$c" in {shlex.quote(root)}|{shlex.quote(root)}/*) echo "${{d#/proc/}}";; esac; '
        "done; true"
    )
    res = await space.exec(["bash", "-c", script], key=None, epoch=epoch, cwd="/")
    pids = []
    for line in res.output.decode(errors="replace").split():
        if line.isdigit():
            pids.append(int(line))
    return pids
