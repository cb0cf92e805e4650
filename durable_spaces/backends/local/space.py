"""One ``local`` Space: a directory on this machine, with no daemon (see ``backend`` for
its layout). The Space checks it still is its instance before every call, fences every
change by the epoch floor, and keeps its ledger and commands in files.

File operations that change the workspace are fenced like commands: the floor is read
under ``lock`` in the same section that makes the change, and ``advance_epoch`` holds
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

Cost: a supervisor started directly is a fresh interpreter (``-I -S``, stdlib only) per
command; the fork server (one per Space, started by
the first spawn) makes that a fork of a small single-threaded process. A shell
supervisor would be faster but cannot tell ``exit 130`` from death by SIGINT, and forking
the caller would copy a threaded driver; both were rejected.

Every section that holds the flock is synchronous and runs in a worker thread, so two
tasks of one event loop can never deadlock on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from durable_spaces.backends.local import fs as local_fs
from durable_spaces.backends.local.cgroups import SpaceCgroups, parent_for
from durable_spaces.backends.local.disk import read_json, write_atomic
from durable_spaces.backends.local.execution import LocalExecution
from durable_spaces.backends.local.forkserver_client import ForkServer
from durable_spaces.backends.local.journal import ChangeJournal
from durable_spaces.backends.local.journaled import JournaledScanner, small_if_free
from durable_spaces.backends.local.ledger import Ledger, record
from durable_spaces.backends.local.procs import kill_space, reap, track
from durable_spaces.backends.local.supervisor import format_spec
from durable_spaces.chaos import mutants
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import (
    PathEscapeError,
    SpaceGoneError,
    SpaceUnavailableError,
    StaleEpochError,
)
from durable_spaces.host.boot import read_host_boot_id
from durable_spaces.host.proc_start import started
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

_SUPERVISOR = str(Path(__file__).with_name("supervisor.py"))
#: What commands inherit from the caller's environment: enough to find programs, nothing
#: of the driver's own (API keys, tokens, failpoints), as in a real sandbox.
_INHERIT = frozenset(
    [
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TERM",
        "TZ",
        "TMPDIR",
        "PYENV_ROOT",
        "PYENV_VERSION",
        "VIRTUAL_ENV",
        "DO_NOT_TRACK",
        "CUA_TELEMETRY",
    ]
)


#: How long a restart or removal of the Space waits for a client holding its lock
#: before it goes ahead without (``LocalSpace._locked``).
MACHINE_PATIENCE_S = 2.0


def _flock(fd: int, patience_s: float | None) -> bool:
    """Take the flock on ``fd``: waiting for good, or at most ``patience_s``."""
    if patience_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


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
        self._server = ForkServer(directory, instance_id, settings)

    @property
    def scan_stats(self) -> dict[str, int]:
        """Counters of the incremental scan (``hashed``: files read and hashed, cumulative;
        ``full`` / ``journal``: scans that walked everything / that the journal answered)."""
        return self._scanner.stats

    def _boot(self) -> str:
        try:
            return (self._d / "boot").read_text()
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
            current = (self._d / "instance").read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            current = None
        if current != self.instance_id:
            raise SpaceGoneError(
                f"Space {self.name} no longer exists (instance {self.instance_id})"
            )

    @contextlib.contextmanager
    def _locked(self, patience_s: float | None = None) -> Iterator[bool]:
        """The Space's lock (flock); yields whether it was taken. With ``patience_s``
        (what the machine itself does: restart, removal) it is given up on when its
        holder does not let go in time, and the caller goes ahead without it. Why: the
        lock is held by clients (this stand-in's daemon runs in its callers), and a client
        frozen inside a spawn (a paused driver, a driver stopped at a failpoint) would
        hold a real machine's restart or removal for as long as it is frozen; the real
        daemon's restart waits for no client. Without the lock a restart only kills and
        writes a new boot id (``LocalBackend.restart``): a spawn it overtook finds its
        supervisor killed (the key reads ``lost``), or forks after it (the command runs
        in the new boot), or finds the Space gone."""
        try:
            fd = os.open(self._d / "lock", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SpaceGoneError(f"Space {self.name} no longer exists") from None
        try:
            locked = _flock(fd, patience_s)
            self._check()
            yield locked
        finally:
            os.close(fd)

    def _floor_locked(self) -> int:
        with self._locked():
            return self._floor()

    def _floor(self) -> int:
        try:
            return int((self._d / "epoch").read_text())
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

    def _env(self, env: Mapping[str, str] | None, epoch: int, cmd_id: str) -> dict[str, str]:
        out = {k: v for k, v in os.environ.items() if k in _INHERIT or k.startswith("LC_")}
        out.update(env or {})
        out.update(DS_SPACE=self.instance_id, DS_EPOCH=str(epoch), DS_CMD=cmd_id)
        return out

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
            cmd_dir = self._d / "cmds" / cmd_id
            cmd_dir.mkdir(exist_ok=True)
            (cmd_dir / "output").write_bytes(b"")
            if stdin is not None:
                (cmd_dir / "stdin").write_bytes(stdin)
            cenv = self._env(env, epoch, cmd_id)
            forked = self._server.fork(cmd_dir)
            popen = None
            if forked is not None:
                pid, ctime = forked.pid, forked.ctime
            else:
                with open(cmd_dir / "supervisor.log", "wb") as log:
                    popen = subprocess.Popen(
                        [sys.executable, "-I", "-S", _SUPERVISOR, str(cmd_dir)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                        cwd=cmd_dir,
                        env=cenv,
                        start_new_session=True,
                    )
                track(popen)
                pid, ctime = popen.pid, started(popen.pid)
            meta = {"pid": pid, "ctime": ctime, "epoch": epoch, "key": key}
            try:
                write_atomic(cmd_dir / "meta.json", json.dumps(meta).encode(), fsync=False)
                hit("space.local.supervisor_recorded")  # dying here: the command never starts
                spec = format_spec(self._cwd(cwd), argv, cenv)
                # Born in its epoch's cgroup: the supervisor waits for the spec, so the
                # command and all it starts are in it (``cgroups.py``).
                self.cgroups.enter(epoch, pid)
            except BaseException:
                if forked is not None:
                    forked.conn.close()  # its child reads EOF now: nothing runs
                elif popen is not None and popen.stdin is not None:
                    popen.stdin.close()  # as above: an empty spec runs nothing
                raise
            if forked is not None:
                forked.send(spec)
            else:
                assert popen is not None and popen.stdin is not None
                with contextlib.suppress(BrokenPipeError):
                    popen.stdin.write(spec)
                    popen.stdin.close()
        hit("space.local.spawned")
        return LocalExecution(
            self._lost,
            key,
            cmd_dir,
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
        why = self.cgroups.why  # None exactly when contained
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
