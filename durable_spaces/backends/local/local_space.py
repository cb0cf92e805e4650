"""One ``local`` Space: a directory on this machine, with no daemon (see ``backend`` for
its layout). The Space checks it still is its instance before every call, fences every
change by the epoch floor, and keeps its ledger and commands in files.

File operations that change the workspace are fenced like commands: the floor is read
under the lock (``lock.py``) in the same section that makes the change, and ``advance_epoch`` holds
``lock`` from its kill to the new floor, so a stale writer's change lands wholly before a
takeover or not at all.

Spawn order, under the flock: check the epoch floor and the ledger; make the epoch's
cgroup (``cgroups.py``, where the host has them); append + fsync the
ledger line; get a supervisor (forked by the Space's fork server, ``forkserver.py``, or
else started directly; either blocks until it reads the command); record its pid and
create time in ``meta.json``; move it into the epoch's cgroup; hand it the command (so
nothing of it runs outside the cgroup). A driver killed before the
last step leaves a key that reads ``lost`` and whose command never starts; after it, the
command runs to its end on its own. A key seen again is never run again (``lost`` keys
come back replayed with ``exit_code=None``). A wait whose command was killed by
``advance_epoch`` raises ``StaleEpochError``; by a restart, ``SpaceUnavailableError``;
by ``delete``, ``SpaceGoneError``.

How a command's supervisor starts, and why so: ``launch``.

Every section that holds the flock is synchronous and runs in a worker thread, so two
tasks of one event loop can never deadlock on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from durable_spaces.backends.local import fs as local_fs
from durable_spaces.backends.local.cgroups import SpaceCgroups, parent_for
from durable_spaces.backends.local.disk import read_json, write_atomic
from durable_spaces.backends.local.execution import LocalExecution
from durable_spaces.backends.local.forkserver_client import ForkServer
from durable_spaces.backends.local.journal import ChangeJournal
from durable_spaces.backends.local.journaled import JournaledScanner, small_if_free
from durable_spaces.backends.local.launch import command_env, launch
from durable_spaces.backends.local.ledger import Ledger, record
from durable_spaces.backends.local.lock import space_lock
from durable_spaces.backends.local.procs import kill_space, reap
from durable_spaces.chaos import mutants
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import (
    PathEscapeError,
    SpaceGoneError,
    SpaceUnavailableError,
    StaleEpochError,
)
from durable_spaces.host.boot import read_host_boot_id
from durable_spaces.host.bounded import MAX_VALUE_BYTES, read_text
from durable_spaces.settings import DEFAULTS, Settings
from durable_spaces.space import (
    CONTAINED_EPOCHS,
    EXEC_LEDGER,
    Capabilities,
    ExecRecord,
    ExecResult,
    ExecState,
    FileStat,
    OutputCallback,
    PathTable,
    confine,
)


class LocalSpace:
    """One ``local`` Space. Every call first checks the Space still is this instance."""

    def __init__(
        self,
        name: str,
        directory: Path,
        instance_id: str,
        cgroup_root: Path | None = None,
        settings: Settings = DEFAULTS,
    ) -> None:
        self.name = name
        self.settings = settings
        self.instance_id = instance_id
        self._d = directory
        parent, why = parent_for(Path(os.path.realpath(directory.parent)), cgroup_root)
        #: The cgroups of its epochs (``cgroups.py``), or why there are none.
        self.cgroups = SpaceCgroups(parent, why, instance_id)
        self.root = str(directory / "work")
        journal = self._journal if settings.space_journal else None
        self._scanner = JournaledScanner(self.root, journal)
        self._scan_lock = threading.Lock()
        self._ledger = Ledger(directory / "ledger.jsonl", self._check)
        self._server = ForkServer(directory, instance_id, settings, self.cgroups.fenced_as)

    @property
    def scan_stats(self) -> dict[str, int]:
        """Counters of the incremental scan (``hashed``: files read and hashed, cumulative;
        ``full`` / ``journal``: scans that walked everything / that the journal answered)."""
        return self._scanner.stats

    def _boot(self) -> str:
        try:
            return read_text(self._d / "boot", max_bytes=MAX_VALUE_BYTES)
        except FileNotFoundError:
            return ""

    def _journal(self, root: str) -> ChangeJournal:
        """The change journal of a full scan: trusted until the machine restarts (the
        backend's ``restart`` writes a new ``boot``) or the epoch rises."""
        boot = self._boot()

        def guard() -> str | None:
            return None if self._boot() == boot else "the Space's machine restarted"

        return ChangeJournal(root, self._staging, guard)

    def workspace_journal(self) -> ChangeJournal | None:
        """A journal of the workspace of its own (``space.JournaledSpace``), for a
        checkpoint's walk; None when ``settings.space_journal`` is off."""
        return self._journal(self.root) if self.settings.space_journal else None

    def host_workspace(self) -> bool:
        """``space.HostWorkspace``: the workspace is this host's directory (the stand-in
        runs here), so a checkpoint need not prove it with a command."""
        return True

    # --- guards -------------------------------------------------------------------------

    def _check(self) -> None:
        try:
            current = read_text(self._d / "instance", max_bytes=MAX_VALUE_BYTES).strip()
        except (FileNotFoundError, NotADirectoryError):
            current = None
        if current != self.instance_id:
            raise SpaceGoneError(
                f"Space {self.name} no longer exists (instance {self.instance_id})"
            )

    def _locked(self, patience_s: float | None = None) -> contextlib.AbstractContextManager[bool]:
        """The Space's lock (``lock``): for good, or with the machine's patience."""
        return space_lock(self._d, self.name, self._check, patience_s)

    def _floor_locked(self) -> int:
        with self._locked():
            return self._floor()

    def _floor(self) -> int:
        try:
            return int(read_text(self._d / "epoch", max_bytes=MAX_VALUE_BYTES))
        except FileNotFoundError:
            self._check()
            raise

    async def _lost(self, ex: LocalExecution) -> BaseException:
        """Why a waiter's command was lost (``LostError``)."""
        self._check()  # SpaceGoneError when the Space was deleted under us
        # Under the lock: advance_epoch holds it from its kill until the new floor.
        floor = await asyncio.to_thread(self._floor_locked)
        if ex.epoch is not None and ex.epoch < floor:  # a newer driver fenced us
            return StaleEpochError(ex.epoch, floor, f"Space {self.name}")
        return SpaceUnavailableError(
            f"command {ex.key or ex.pid} of Space {self.name} was lost: "
            "its machine stopped while it ran (outcome unknown)"
        )

    # --- records ------------------------------------------------------------------------

    def _record(self, key: str, line: dict[str, Any] | None) -> ExecRecord:
        return record(self._d / "cmds", key, line)

    def _record_sync(self, key: str) -> ExecRecord:
        self._check()
        line = self._ledger.line(key)
        if line is not None and not (self._d / "cmds" / line["cmd"] / "meta.json").exists():
            with self._locked():  # a spawn may be between its ledger line and its pid
                return self._record(key, self._ledger.line(key))
        return self._record(key, line)

    async def exec_record(self, key: str) -> ExecRecord:
        return await asyncio.to_thread(self._record_sync, key)

    # --- commands -----------------------------------------------------------------------

    def _cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.root
        if os.path.isabs(cwd):
            return cwd  # the "machine" is this host: any absolute cwd is inside it
        return os.path.join(self.root, confine(self.root, cwd))

    def _existing(
        self, key: str, line: dict[str, Any], keep_output: int | None = None
    ) -> LocalExecution:
        rec = self._record(key, line)
        cmd_dir = self._d / "cmds" / line["cmd"]
        if rec.state is ExecState.RUNNING:
            meta = read_json(cmd_dir / "meta.json") or {}
            return LocalExecution(
                self._lost,
                key,
                cmd_dir,
                rec.pid,
                meta["ctime"],
                reattached=True,
                epoch=rec.epoch,
                keep_output=keep_output,
            )
        # Exited: the recorded outcome. Lost: nothing runs again; exit_code None = unknown.
        result = ExecResult(
            key=key,
            exit_code=rec.exit_code,
            signal=rec.signal,
            output=rec.output_tail,
            replayed=True,
        )
        return LocalExecution(self._lost, key, cmd_dir, rec.pid, 0.0, replay=result)

    def _spawn_sync(
        self,
        argv: list[str],
        key: str | None,
        epoch: int,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        keep_output: int | None = None,
    ) -> LocalExecution:
        reap()
        with self._locked():
            floor = self._floor()
            if epoch < floor:
                raise StaleEpochError(epoch, floor, f"Space {self.name}")
            if key is not None:
                line = self._ledger.line(key)
                if line is not None:
                    return self._existing(key, line, keep_output)
            self.cgroups.prepare(epoch)  # a host that refuses: nothing recorded yet
            if key is not None:
                cmd_id = "k-" + hashlib.sha256(key.encode()).hexdigest()[:32]
                self._ledger.append(
                    {"key": key, "epoch": epoch, "cmd": cmd_id, "argv": argv, "t": time.time()}
                )
                hit("space.local.ledger_written")
            else:
                cmd_id = "p-" + uuid.uuid4().hex
            pid, ctime, popen = launch(
                self._server,
                self.cgroups,
                self._d / "cmds" / cmd_id,
                epoch=epoch,
                key=key,
                argv=argv,
                cwd=self._cwd(cwd),
                env=command_env(env, self.instance_id, epoch, cmd_id),
                stdin=stdin,
            )
        hit("space.local.spawned")
        return LocalExecution(
            self._lost,
            key,
            self._d / "cmds" / cmd_id,
            pid,
            ctime,
            popen=popen,
            epoch=epoch,
            keep_output=keep_output,
        )

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        key: str | None,
        epoch: int,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        keep_output: int | None = None,
        new_key: bool = False,
    ) -> LocalExecution:
        """See ``Space.spawn``. A key whose record is ``lost`` is not run again either: it
        comes back replayed with ``exit_code=None`` (outcome unknown). ``new_key`` changes
        nothing here: the ledger is read in the same worker-thread hop as the spawn."""
        if stdin is not None and key is not None:
            raise ValueError("stdin is only supported with key=None")
        if not argv:
            raise ValueError("empty argv")
        self._check()
        try:
            return await asyncio.to_thread(
                self._spawn_sync, list(argv), key, epoch, cwd, env, stdin, keep_output
            )
        except FileNotFoundError:
            self._check()  # removed under a spawn that had the lock: SpaceGoneError
            raise

    async def exec(
        self,
        argv: Sequence[str],
        *,
        key: str | None,
        epoch: int,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        on_output: OutputCallback | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        ex = await self.spawn(argv, key=key, epoch=epoch, cwd=cwd, env=env, stdin=stdin)
        if on_output is not None:
            async for chunk in ex.output():
                on_output(chunk)
        return await ex.wait()

    # --- epochs and the machine ----------------------------------------------------------

    async def current_epoch(self) -> int:
        self._check()
        return self._floor()

    def _advance_sync(self, epoch: int) -> None:
        with self._locked():
            floor = self._floor()
            if epoch < floor:
                raise StaleEpochError(epoch, floor, f"advance_epoch of Space {self.name}")
            if epoch == floor:
                return
            self.cgroups.kill_below(epoch)  # everything they started, wherever it went
            kill_space(self._d, self.instance_id, below_epoch=epoch)  # outside any cgroup
            write_atomic(self._d / "epoch", str(epoch).encode())
        with self._scan_lock:
            self._scanner.reset("a new epoch")

    async def advance_epoch(self, epoch: int) -> None:
        self._check()
        await asyncio.to_thread(self._advance_sync, epoch)

    async def capabilities(self) -> Capabilities:
        self._check()
        why = self.cgroups.unfenced  # None exactly when contained
        return Capabilities(
            kind="local",
            exec_ledger=True,
            machine_checkpoints=False,
            features=frozenset({EXEC_LEDGER} | ({CONTAINED_EPOCHS} if why is None else set())),
            missing={} if why is None else {CONTAINED_EPOCHS: why},
        )

    # --- files --------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        self._check()
        return local_fs.read_file(self.root, path)

    def _read_files_sync(self, paths: list[str]) -> dict[str, bytes]:
        with self._scan_lock:
            kept = self._scanner.kept  # what the last scan read (a new dict per scan)
        out: dict[str, bytes] = {}
        for p in paths:
            rel = confine(self.root, p)
            data = kept.get(rel)
            if data is None:
                try:
                    data = local_fs.read_file(self.root, rel)
                except (OSError, PathEscapeError):
                    continue  # missing, not a file, or behind a symlink: left out
            out[p] = data
        return out

    async def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """See ``Space.read_files``: the bytes the last scan read where it kept them
        (all of them kept: answered here, as ``small_if_free`` answers a small scan, the
        hand-off to a worker thread costing more than the lookups)."""
        self._check()
        paths = list(paths)
        found = self._kept_if_free(paths)
        if found is not None:
            return found
        return await asyncio.to_thread(self._read_files_sync, paths)

    def _kept_if_free(self, paths: list[str]) -> dict[str, bytes] | None:
        """Every one of ``paths`` from the last scan's kept bytes; None when one is not
        kept, or a worker thread holds the scanner."""
        if not self._scan_lock.acquire(blocking=False):
            return None
        try:
            kept = self._scanner.kept
        finally:
            self._scan_lock.release()
        out: dict[str, bytes] = {}
        for p in paths:
            data = kept.get(confine(self.root, p))
            if data is None:
                return None
            out[p] = data
        return out

    def _mutate_sync(self, epoch: int, op: Callable[[], None]) -> None:
        """A file operation, fenced: under the lock ``advance_epoch`` holds from its kill
        to the new floor, so it lands wholly before a takeover or is refused."""
        hit("space.mutate")  # issued: a driver paused here is continued into the check
        with self._locked():
            floor = self._floor()
            if epoch < floor and not mutants.active("unfenced_mutations"):
                raise StaleEpochError(epoch, floor, f"Space {self.name}")
            op()

    async def _mutate(self, epoch: int, op: Callable[[], None]) -> None:
        self._check()
        await asyncio.to_thread(self._mutate_sync, epoch, op)

    @property
    def _staging(self) -> str:
        return str(self._d / "staging")

    async def write_file(
        self, path: str, data: bytes, mode: int | None = None, *, epoch: int
    ) -> None:
        await self._mutate(
            epoch, lambda: local_fs.write_file(self.root, path, data, mode, self._staging)
        )

    async def symlink(self, path: str, target: str, *, epoch: int) -> None:
        await self._mutate(epoch, lambda: local_fs.symlink(self.root, path, target, self._staging))

    async def stat(self, path: str) -> FileStat | None:
        self._check()
        return local_fs.stat(self.root, path)

    async def list_dir(self, path: str = ".") -> list[str]:
        self._check()
        return local_fs.list_dir(self.root, path)

    async def remove(self, path: str, recursive: bool = False, *, epoch: int) -> None:
        await self._mutate(epoch, lambda: local_fs.remove(self.root, path, recursive))

    def _scan_sync(self, root: str, exclude: Sequence[str]) -> PathTable:
        with self._scan_lock:
            table = self._scanner.scan(root, exclude)
        assert table is not None  # a local scan always walks this host
        return table

    async def scan(self, root: str = ".", exclude: Sequence[str] = ()) -> PathTable:
        self._check()
        table = small_if_free(self._scan_lock, self._scanner, root, list(exclude))
        if table is not None:
            return table
        return await asyncio.to_thread(self._scan_sync, root, list(exclude))

    async def host_boot_id(self) -> str | None:
        """The boot id of the host this directory is on (``durable_spaces/host/boot.py``):
        a power loss drops the workspace's unsynced writes with the log's."""
        return read_host_boot_id(self.settings.host_boot_id)

    async def close(self) -> None:
        with self._scan_lock:
            self._scanner.close()
        reap()
