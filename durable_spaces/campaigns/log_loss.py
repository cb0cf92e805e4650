"""A log whose storage alone can lose power, for the runs of a ``log-loss`` profile.

The drivers' state dir (the log, the coordinator's file) is on a powerfs mount of its
own (``<run>/host`` over ``<run>/host.disk``, as ``power.py`` lays it out); the Spaces and
the checkpoint store stay on the ordinary disk. That is a log on a shared mount, or on
another host of the many-hosts layout: it can lose its unsynced tail while the host that
runs the Space never reboots, so the host's boot id says nothing
(``adapter/log_witness.py`` is the witness that must see it).

``log_loss`` (the nemesis's ``LogStorage``): the drivers of the run are SIGKILLed (they
write the log: a driver on the log's host dies with it; one elsewhere would see its
commits fail), the mount loses power (its volatile state dropped; with a drawn tear the
last unsynced write of each file lands in part) and comes back. The Space, its daemon,
its processes and the boot id are untouched. The report is ``power.py``'s: the log's
commits before and after the cut, and what the Space's ledger holds; ``kept`` names what
the cut left: ``all`` (nothing was lost), ``prefix`` (an older prefix of the log: the
case the host's boot id cannot see) or ``none`` (every commit lost).

A SQLite log at ``NORMAL`` syncs its WAL only when it checkpoints it (at close, or after
a thousand pages): a short run's cut would always lose every commit. A kernel writes
dirty pages back after a while on its own; the host does so for the log's files before
a driver's launch, drawn per launch (``p_writeback``), so a later cut keeps that older
prefix and drops only what came after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_spaces.campaigns.power import (
    PowerHost,
    _compare,
    killed_in_commit,
    ledger_files,
    look,
)
from durable_spaces.host.files import fsync_dir

if TYPE_CHECKING:
    from durable_spaces.drive.coordinator import Launch

#: How long a killed driver gets to be reaped before the cut comes anyway.
_REAP_S = 30.0


class LogHost(PowerHost):
    """The log's mount: ``start(["session"], ...)`` as ``PowerHost``'s; ``log_loss`` is
    the fault. ``spaces`` is where the backend keeps its Spaces (off the mount)."""

    def __init__(
        self,
        root: Path,
        seed: str,
        spaces: Path,
        *,
        p_writeback: float,
        p_tear: float,
        log_synchronous: str | None,
        log_format: str = "sqlite",
    ):
        super().__init__(
            root, seed, p_tear=p_tear, log_synchronous=log_synchronous, log_format=log_format
        )
        self.spaces = spaces
        self.p_writeback = p_writeback
        self.launches = 0
        self.writebacks = 0

    async def before_launch(self, launch: Launch) -> None:
        await super().before_launch(launch)
        n, self.launches = self.launches, self.launches + 1
        if n and random.Random(f"{self.seed}:writeback:{n}").random() < self.p_writeback:
            self._writeback()

    def _writeback(self) -> None:
        """Make what the log's files hold now durable (no driver runs: the launch waits)."""
        session = self.mountpoint / "session"
        for name in (self._log_name(), f"{self._log_name()}-wal"):
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(session / name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_dir(session)
        self.writebacks += 1

    async def power_loss(self, value: Mapping[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the log's mount loses its tail (log_loss), not the host's power")

    async def log_loss(self, value: Mapping[str, Any]) -> dict[str, Any]:
        if self.fs is None or self._coordinator is None:
            raise RuntimeError("log_loss before the log's mount was started and attached")
        self.up.clear()
        try:
            attempt = self._coordinator.current
            pid = self._coordinator.kill_current("log_loss")
            others = []  # drivers given up on, still running: they write the log too
            for old in (a for c in self._coordinators for a in c.history):
                if old.alive and old is not attempt:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(old.pid, signal.SIGKILL)
                        others.append(old.pid)
            dying = [a for c in self._coordinators for a in c.history if a.pid in others]
            if pid is not None and attempt is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(attempt.done.wait(), _REAP_S)
                dying.append(attempt)
            elif self._coordinator.history:  # killed just before (after_kill)
                dying.append(self._coordinator.history[-1])
            # a commit whose driver died inside it was never acknowledged (power.py)
            in_flight = killed_in_commit(dying)
            tear = random.Random(f"{self.seed}:tear:{self.boots}").random() < self.p_tear
            before = self._look()
            report = self.fs.cut(tear=tear)  # no await: nothing else touches the mount now
            after = self._look()
            self.boots += 1  # the mount's, not the host's: the boot id stays
        finally:
            self.up.set()
        cut = {
            "kind": "log_loss",
            "kept": _kept(before.get("commits"), after.get("commits")),
            "writebacks": self.writebacks,
            "killed": pid,
            "killed_stale": others,
            "tear": tear,
            "dropped_ops": report.ops,
            "dropped_bytes": report.bytes,
            "torn": len(report.torn),
            "in_flight_commits": in_flight,
            **_compare(before, after),
        }
        self.cuts.append(cut)
        return cut

    def _look(self) -> dict[str, Any]:
        ledger, epoch = ledger_files(self.spaces / self._space)
        return look(self.mountpoint / "session" / self._log_name(), ledger, epoch)


def _kept(before: int | None, after: int | None) -> str | None:
    """What a cut left of the log: ``all``, an older ``prefix``, or ``none``."""
    if before is None:
        return None
    if (after or 0) >= before:
        return "all"
    return "prefix" if after else "none"


__all__ = ["LogHost"]
