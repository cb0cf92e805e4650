"""A host that can lose power, for the runs of a ``power`` profile (``chaos/profiles.py``).

The run's durable state lives under one powerfs mount (``chaos/powerfs``): the drivers'
state dir with the log and the coordinator's file, the ``local`` Spaces' root and the
checkpoint store, at ``<run>/host`` over the backing dir ``<run>/host.disk``. They are
on one disk of one machine, so one cut drops their unsynced writes together.

``power_loss`` (the nemesis's ``Host``) is a host crash: every process of the host is
SIGKILLed (the driver, and the Space's supervisors and commands: the ``local`` stand-in's
"daemon"), the mount loses power (its volatile state dropped; with a drawn tear the last
unsynced write of each file lands in part), and the host boots again: a new boot id in
``<run>/boot_id``, which the drivers' ``local`` Spaces report (``DS_HOST_BOOT_ID``; on a
real host that is ``/proc/sys/kernel/random/boot_id``). The coordinator (the control
plane, off the host) waits until the host is up before it launches the next driver.

The cut itself runs on the event loop without yielding: no file operation of the
coordinator is half-way through the mount while the power goes.

The host's disk can also be slow (a per-run latency on every durability call) or stall
(``StallableDisk`` for ``nemesis.DiskStaller``; ``chaos/powerfs/disk.py``). A process
stuck in a stalled call cannot die until the call returns, so a power loss during a stall
kills it and fails its call (``PowerFS.fail``): it dies at once, and what the call was
making durable is lost with the cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from durable_spaces.campaigns.checks.rawlog import MAX_LOG_BYTES, read_log
from durable_spaces.campaigns.inject import last_hit
from durable_spaces.chaos.points import LOG_BEFORE_COMMIT
from durable_spaces.chaos.powerfs import PowerFS, mount
from durable_spaces.drive.supervisor import now_ms
from durable_spaces.errors import LogError, SpaceError
from durable_spaces.host.boot import BOOT_ENV
from durable_spaces.host.bounded import MAX_VALUE_BYTES, parse_json, read_bytes, read_text

if TYPE_CHECKING:
    from durable_spaces.drive.coordinator import Attempt, Coordinator, Launch
    from durable_spaces.space import Faults, SpaceBackend

#: The driver's log's SQLite ``synchronous`` level and format (``drive/entry.py``).
LOG_SYNC_ENV = "DS_LOG_SYNCHRONOUS"
LOG_FORMAT_ENV = "DS_LOG_FORMAT"
HOST_DIR = "host"
DISK_DIR = "host.disk"
FS_STATE_DIR = "host.powerfs"
BOOT_FILE = "boot_id"
#: How long a killed driver gets to be reaped before the power goes anyway.
_REAP_S = 30.0


def boot_id(seed: str, boot: int) -> str:
    """The host's boot id of its ``boot``-th boot (from the run's seed: reproducible)."""
    h = hashlib.sha256(f"{seed}:boot:{boot}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _write_boot(path: Path, value: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(value + "\n")
    os.replace(tmp, path)


class PowerHost:
    """One run's host: ``start(dirs)`` lays the given directories (relative to the
    mount) out durably and mounts; ``power_loss`` is the fault; ``stop()`` unmounts."""

    def __init__(
        self,
        root: Path,
        seed: str,
        *,
        p_tear: float,
        log_synchronous: str | None,
        log_format: str = "sqlite",
        fsync_ms: float = 0.0,
    ):
        self.root = root
        self.fsync_ms = fsync_ms
        self.seed = seed
        self.p_tear = p_tear
        self.log_synchronous = log_synchronous
        self.log_format = log_format
        self.mountpoint = root / HOST_DIR
        self.disk = root / DISK_DIR
        self.boot_file = root / BOOT_FILE
        self.boots = 0
        self.fs: PowerFS | None = None
        self.up = asyncio.Event()
        self.up.set()
        self.cuts: list[dict[str, Any]] = []
        self._coordinator: Coordinator | None = None
        self._coordinators: list[Coordinator] = []
        self._backend: SpaceBackend | None = None
        self._up_ms = 0.0  # when the host last came up (``now_ms``, as ``Attempt``'s)
        self._space = ""

    def start(self, dirs: Sequence[str], off_host: Sequence[str] = ()) -> None:
        """Create ``dirs`` in the backing dir (durable before the first boot: the lab's
        set-up is not what is tested) and ``off_host`` as symbolic links to directories
        of the same name beside the mount (the lab's own records, e.g. the drivers'
        output, which a cut must not take), write the first boot id, mount."""
        for d in dirs:
            (self.disk / d).mkdir(parents=True, exist_ok=True)
        for d in off_host:
            target = self.root / Path(d).name
            target.mkdir(parents=True, exist_ok=True)
            (self.disk / d).parent.mkdir(parents=True, exist_ok=True)
            (self.disk / d).symlink_to(target)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        _write_boot(self.boot_file, boot_id(self.seed, 0))
        state = self.root / FS_STATE_DIR
        self.fs = mount(self.disk, self.mountpoint, seed=self.seed, state_dir=state)
        if self.fsync_ms:
            self.fs.latency(self.fsync_ms)

    def _mounted(self) -> PowerFS:
        if self.fs is None:
            raise RuntimeError("the host's disk is not mounted")
        return self.fs

    def stall(self, seconds: float) -> None:
        """The disk stops completing durability calls for at most ``seconds``."""
        self._mounted().stall(seconds)

    def resume(self, *, keep_stuck: bool = False) -> None:
        """The disk serves again (``keep_stuck``: new calls only)."""
        self._mounted().resume(keep_stuck=keep_stuck)

    def held(self) -> tuple[list[int], list[str]]:
        """The processes stuck inside a durability call now, and the files (mount paths)."""
        state = self._mounted().disk()
        return list(state.held_pids), list(state.held_paths)

    def stop(self) -> None:
        """A clean unmount (everything made durable, as umount flushes)."""
        if self.fs is not None:
            with contextlib.suppress(Exception):
                self.fs.unmount()
            self.fs = None

    def host(self, coordinator: Coordinator) -> None:
        """Every coordinator of the run launches its drivers on this host (its hook comes
        first: a launch waits for the host, and gets its log level and boot id), and a
        power loss kills them all (a ``stale`` run's first coordinator's too)."""
        coordinator.before_launch.insert(0, self.before_launch)
        self._coordinators.append(coordinator)

    def attach(self, coordinator: Coordinator, backend: SpaceBackend, space: str) -> None:
        """The coordinator the nemesis plays against (``host()``ed already) and the Space
        the host holds."""
        if coordinator not in self._coordinators:
            self.host(coordinator)
        self._coordinator = coordinator
        self._backend = backend
        self._space = space

    async def before_launch(self, launch: Launch) -> None:
        """A driver starts only on a host that is up, told where its boot id is."""
        await self.up.wait()
        launch.env[BOOT_ENV] = str(self.boot_file)
        if self.log_synchronous is not None:
            launch.env[LOG_SYNC_ENV] = self.log_synchronous
        launch.env[LOG_FORMAT_ENV] = self.log_format

    async def power_loss(self, value: Mapping[str, Any]) -> dict[str, Any]:
        if self.fs is None or self._coordinator is None or self._backend is None:
            raise RuntimeError("power_loss before the host was started and attached")
        self.up.clear()
        up, self._up_ms = self._up_ms, now_ms()
        try:
            attempt = self._coordinator.current
            pid = self._coordinator.kill_current("power_loss")
            stale = []  # drivers given up on, still running (paused, stuck): on the host
            for old in (a for c in self._coordinators for a in c.history):
                if old.alive and old is not attempt:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(old.pid, signal.SIGKILL)
                        stale.append(old.pid)
            # A process stuck in a stalled fsync cannot die until its call returns: kill
            # it and fail its call (it dies at once, never seeing it; the data is lost).
            disk = self.fs.disk()
            held = [p for p in disk.held_pids if p != os.getpid()]
            # a log commit whose fsync is held was never acknowledged: it may be seen
            # before the cut (a reader recovers the log's written WAL) and be gone after
            log = f"/session/{self._log_name()}"
            in_flight = sum(1 for p in disk.held_paths if p == log or p.startswith(log + "-"))
            for p in held:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            if held:
                self.fs.fail(held)
            if pid is not None and attempt is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(attempt.done.wait(), _REAP_S)
            power_off = getattr(self._backend, "power_off", None)
            with contextlib.suppress(SpaceError):
                # every process of the Space (the local stand-in's "daemon" is its tree;
                # a spacesd daemon is killed whole and not started again before the cut)
                if power_off is not None:
                    await power_off(self._space)
                else:
                    await cast("Faults", self._backend).kill_daemon(self._space)
            # Nor was a commit whose driver died inside it, killed now or just before
            # (after_kill): its write may be in the WAL, its fsync never returned. A driver
            # stuck in a held fsync is counted both ways: the larger count, not the sum.
            # Their traces are read once they are dead.
            dying = [a for c in self._coordinators for a in c.history if a.pid in stale]
            for c in self._coordinators:  # the newest of each: no driver wrote after it
                if c.history and (c.history[-1] is attempt or _ended_since(c.history[-1], up)):
                    dying.append(c.history[-1])
            in_flight = max(in_flight, killed_in_commit(dying))
            tear = random.Random(f"{self.seed}:tear:{self.boots}").random() < self.p_tear
            before = self._look()
            report = self.fs.cut(tear=tear)  # no await: nothing else touches the mount now
            after = self._look()
            self.boots += 1
            _write_boot(self.boot_file, boot_id(self.seed, self.boots))
            if power_off is not None:
                with contextlib.suppress(SpaceError):
                    await self._backend.find(self._space)  # the machine boots with the host
        finally:
            self.up.set()
        cut = {
            "killed": pid,
            "killed_stale": stale,
            "tear": tear,
            "dropped_ops": report.ops,
            "dropped_bytes": report.bytes,
            "torn": len(report.torn),
            "held": report.held,  # durability calls a disk stall held: failed by the cut
            "failed_held": held,  # the processes stuck in a stalled call, killed first
            "in_flight_commits": in_flight,  # unacknowledged: checks/power.py allows them
            **_compare(before, after),
        }
        self.cuts.append(cut)
        return cut

    def _look(self) -> dict[str, Any]:
        """The host's state as a reader sees it now (every process on it is dead)."""
        ledger, epoch = ledger_files(self.mountpoint / "spaces" / self._space)
        return look(self.mountpoint / "session" / self._log_name(), ledger, epoch)

    def _log_name(self) -> str:
        return "log.jsonl" if self.log_format == "jsonl" else "log.sqlite"


def killed_in_commit(attempts: Sequence[Attempt]) -> int:
    """How many of these drivers died inside a commit of the log: the last point their
    failpoint trace shows is ``log.before_commit`` (``harness/log.py``: hit once the
    commit is built, before it is written; ``log.after_commit`` once it is durable).
    Such a commit's write may be in the log's WAL, where a reader before the cut finds
    it, while its fsync never returned: it was never acknowledged, and a cut may take
    it. A driver killed after the fsync returned but before its next hit lost nothing
    (its commit is durable), so the count only ever excuses unacknowledged commits."""
    n = 0
    for a in attempts:
        hit = last_hit(Path(a.trace)) if a.trace else None
        if hit is not None and hit[0] == LOG_BEFORE_COMMIT:
            n += 1
    return n


def _ended_since(a: Attempt, ms: float) -> bool:
    return a.ended_ms is not None and a.ended_ms >= ms


def ledger_files(space: Path) -> tuple[Path, Path]:
    """The exec ledger and the epoch file of the Space whose directory is ``space``: a
    spacesd daemon's (its ``data``, ``backends/spacesd/daemon.py``) or a local one's."""
    data = space / "data"
    if data.is_dir():
        return data / "exec-ledger.jsonl", data / "exec-epoch"
    return space / "ledger.jsonl", space / "epoch"


def look(log: Path, ledger: Path, epoch_file: Path) -> dict[str, Any]:
    """Commits, their highest epoch and the fence floor of the log; the highest epoch in
    the Space's exec ledger and its floor (None for what cannot be read)."""
    out: dict[str, Any] = {"commits": None, "log_epoch": None, "log_floor": None}
    if log.exists():
        with contextlib.suppress(LogError):
            raw = read_log(log)
            out["commits"] = len(raw.commits)
            out["log_epoch"] = max((c.epoch or 0 for c in raw.commits), default=0)
            out["log_floor"] = raw.floor if raw.format == "sqlite" else _marker_floor(log)
    epochs = []
    with contextlib.suppress(OSError):
        for line in read_bytes(ledger, max_bytes=MAX_LOG_BYTES).splitlines():
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                epochs.append(int(parse_json(line, where=str(ledger)).get("epoch")))
    out["ledger_epoch"] = max(epochs, default=None)
    floor = None
    with contextlib.suppress(OSError, ValueError):
        floor = int(read_text(epoch_file, max_bytes=MAX_VALUE_BYTES).strip() or 0)
    out["space_floor"] = floor
    return out


def _marker_floor(log: Path) -> int | None:
    """A JSONL log's fence floor: its highest ``epoch-<n>`` marker
    (``harness/log_jsonl.py``'s ``FencedFileSystem``), None when there is none."""
    try:
        names = os.listdir(f"{log}.fence")
    except OSError:
        return None
    epochs = [int(n[6:]) for n in names if n.startswith("epoch-") and n[6:].isdigit()]
    return max(epochs, default=None)


def _compare(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What one cut did (``checks/power.py`` names it)."""
    b, a = before.get("commits"), after.get("commits")
    lost = None if b is None else b - (a or 0)
    log_epoch = after.get("log_epoch") or 0
    ahead = (after.get("ledger_epoch") or 0) > log_epoch or (after.get("space_floor") or 0) > (
        after.get("log_floor") or 0
    )
    return {
        "commits_before": b,
        "commits_after": a,
        "lost_commits": lost,
        "space_ahead": ahead,
        "after": dict(after),
    }


__all__ = ["BOOT_ENV", "LOG_SYNC_ENV", "PowerHost", "boot_id"]
