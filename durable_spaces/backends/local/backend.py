"""Backend ``local``: a Space that is a directory on this machine, with no daemon.

A stand-in for cua-spacesd that keeps the same contract with files and detached
processes, for tests and for machines without the real daemon. Layout of a Space::

    <state_dir>/<name>/
        instance       uuid written at create (Space.instance_id)
        work/          the workspace (Space.root)
        ledger.jsonl   one line per key, fsynced before the command is spawned
        epoch          the floor, replaced atomically under ``lock`` (flock)
        lock
        staging/       temporaries of file writes (renamed into work/, never left there)
        cmds/<id>/     meta.json (supervisor pid + create time, epoch), output, status

File operations that change the workspace are fenced like commands: the floor is read
under ``lock`` in the same section that makes the change, and ``advance_epoch`` holds
``lock`` from its kill to the new floor, so a stale writer's change lands wholly before a
takeover or not at all.

A command runs under ``supervisor.py`` in its own session and process group. The
supervisor does not depend on its caller: a SIGKILLed driver leaves it running, and the
next driver reattaches by key (reads ``output`` from offset 0 until ``status`` appears).
Liveness is psutil with the create time, so a reused pid is not mistaken for ours, and
a zombie counts as dead (pid 1 of these machines does not reap orphans).

The "machine" is the Space's process tree: every command carries ``DS_SPACE=<instance>``
(and ``DS_EPOCH``) in its environment, and restart/delete kill every recorded process
group plus every process whose environment carries the mark. A process that both leaves
the group and clears its environment escapes: the documented weak spot of a stand-in.

Spawn order, under the flock: check the epoch floor and the ledger; append + fsync the
ledger line; start the supervisor (it blocks reading its stdin); record its pid and
create time in ``meta.json``; hand it the command on stdin. A driver killed before the
last step leaves a key that reads ``lost`` and whose command never starts; after it, the
command runs to its end on its own. A key seen again is never run again (``lost`` keys
come back replayed with ``exit_code=None``). A wait whose command was killed by
``advance_epoch`` raises ``StaleEpochError``; by a restart, ``SpaceUnavailableError``;
by ``delete``, ``SpaceGoneError``.

Cost: the supervisor is a fresh interpreter (``-I -S``, stdlib only), about 10 ms of an
idle machine per command, which dominates the exec round trip. A shell supervisor would
be faster but cannot tell ``exit 130`` from death by SIGINT, and forking the caller
would copy a threaded driver; both were rejected.

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
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from durable_spaces.backends.local import fs as local_fs
from durable_spaces.backends.local.supervisor import format_spec
from durable_spaces.chaos import mutants
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import (
    ConfigError,
    SpaceGoneError,
    SpaceUnavailableError,
    StaleEpochError,
)
from durable_spaces.space import (
    EXEC_LEDGER,
    OUTPUT_TAIL_BYTES,
    BoundedOutput,
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
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
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
_KILL_TIMEOUT = 10.0
_POLL_MIN, _POLL_MAX = 0.002, 0.05

#: Supervisors this process started, kept so they are reaped (and never warned about).
_children: set[subprocess.Popen[bytes]] = set()
_children_lock = threading.Lock()


def unavailable_reason() -> str | None:
    """Why this backend cannot run here, or None (conformance-suite convention)."""
    if not sys.platform.startswith("linux"):
        return f"the local backend needs Linux (posix_spawn, O_NOFOLLOW walks), not {sys.platform}"
    return None


def _reap() -> None:
    with _children_lock:
        for p in [p for p in _children if p.poll() is not None]:
            _children.discard(p)


def _alive(pid: int, ctime: float) -> bool:
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - ctime) > 0.01:
            return False  # the pid was reused
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _dead(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return True
    except psutil.AccessDenied:
        return False


def _write_atomic(path: Path, data: bytes, fsync: bool = True) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.rename(tmp, path)
    if fsync:
        _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None


def _tail(path: Path, n: int = OUTPUT_TAIL_BYTES) -> bytes:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - n))
            return f.read(n)
    except FileNotFoundError:
        return b""


class LocalExecution:
    """A command started, reattached to, or replayed by a ``LocalSpace``."""

    def __init__(
        self,
        space: LocalSpace,
        key: str | None,
        cmd_dir: Path,
        pid: int | None,
        ctime: float,
        *,
        popen: subprocess.Popen[bytes] | None = None,
        reattached: bool = False,
        replay: ExecResult | None = None,
        epoch: int | None = None,
        keep_output: int | None = None,
    ) -> None:
        self.key = key
        self.epoch = epoch
        self.pid = pid
        self.reattached = reattached
        self.replayed = replay is not None
        self._space = space
        self._dir = cmd_dir
        self._ctime = ctime
        self._popen = popen
        self._replay = replay
        self._collected = BoundedOutput(keep_output)
        self._gen: AsyncIterator[bytes] | None = None
        self._detached = False
        self._lost = False

    async def output(self) -> AsyncIterator[bytes]:
        if self._gen is None:
            self._gen = self._follow()
        async for chunk in self._gen:
            self._collected.add(chunk)
            yield chunk

    async def _follow(self) -> AsyncIterator[bytes]:
        if self._replay is not None:
            if self._replay.output:
                yield self._replay.output
            return
        try:
            fd = os.open(self._dir / "output", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._lost = True
            return
        exited = asyncio.Event()
        pidfd = self._watch_exit(exited)
        try:
            interval = _POLL_MIN
            while not self._detached:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    yield chunk
                    interval = _POLL_MIN
                    continue
                if (self._dir / "status").exists():
                    while chunk := os.read(fd, 1 << 16):
                        yield chunk
                    return
                if self._popen is not None:
                    self._popen.poll()
                if self.pid is None or not _alive(self.pid, self._ctime):
                    if (self._dir / "status").exists():
                        continue  # it finished between our two looks: drain
                    while chunk := os.read(fd, 1 << 16):
                        yield chunk
                    self._lost = True
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(exited.wait(), interval)
                interval = min(interval * 2, _POLL_MAX)
        finally:
            os.close(fd)
            if pidfd is not None:
                asyncio.get_running_loop().remove_reader(pidfd)
                os.close(pidfd)

    def _watch_exit(self, exited: asyncio.Event) -> int | None:
        """Set ``exited`` the moment the supervisor exits (a pidfd works for any process,
        not only our children), so the end of a command is seen without polling delay."""
        if self.pid is None or not hasattr(os, "pidfd_open"):
            return None
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            return None  # already gone: the polling loop notices
        if not _alive(self.pid, self._ctime):  # opened after the pid was reused
            os.close(pidfd)
            return None
        asyncio.get_running_loop().add_reader(pidfd, exited.set)
        return pidfd

    async def wait(self) -> ExecResult:
        if self._replay is not None:
            return self._replay
        async for _ in self.output():
            pass
        if self._detached:
            raise RuntimeError("wait() after detach()")
        if self._lost:
            self._space._check()  # SpaceGoneError when the Space was deleted under us
            # Under the lock: advance_epoch holds it from its kill until the new floor.
            floor = await asyncio.to_thread(self._space._floor_locked)
            if self.epoch is not None and self.epoch < floor:  # a newer driver fenced us
                raise StaleEpochError(self.epoch, floor, f"Space {self._space.name}")
            raise SpaceUnavailableError(
                f"command {self.key or self.pid} of Space {self._space.name} was lost: "
                "its machine stopped while it ran (outcome unknown)"
            )
        status = _read_json(self._dir / "status") or {}
        if self._popen is not None:
            self._popen.wait()
            _reap()
        if self.key is None:
            shutil.rmtree(self._dir, ignore_errors=True)
        return ExecResult(
            key=self.key,
            exit_code=status.get("exit_code"),
            signal=status.get("signal"),
            output=self._collected.value(),
            reattached=self.reattached,
            output_bytes=self._collected.total,
        )

    async def detach(self) -> None:
        self._detached = True


class LocalSpace:
    """One ``local`` Space. Every call first checks the Space still is this instance."""

    def __init__(self, backend: LocalBackend, name: str, directory: Path, instance_id: str):
        self.name = name
        self.instance_id = instance_id
        self._backend = backend
        self._d = directory
        self.root = str(directory / "work")
        self._scanner = local_fs.Scanner()
        self._scan_lock = threading.Lock()
        self._ledger: dict[str, dict[str, Any]] = {}
        self._ledger_off = 0
        self._ledger_lock = threading.Lock()  # spawn and exec_record run in worker threads

    @property
    def scan_stats(self) -> dict[str, int]:
        """Counters of the incremental scan (``hashed``: files read and hashed, cumulative)."""
        return self._scanner.stats

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
    def _locked(self) -> Iterator[None]:
        try:
            fd = os.open(self._d / "lock", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SpaceGoneError(f"Space {self.name} no longer exists") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._check()
            yield
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

    # --- the ledger ---------------------------------------------------------------------

    def _ledger_line(self, key: str) -> dict[str, Any] | None:
        """The ledger's line for ``key``; only bytes appended since the last look are read."""
        with self._ledger_lock:
            return self._ledger_line_locked(key)

    def _ledger_line_locked(self, key: str) -> dict[str, Any] | None:
        try:
            with open(self._d / "ledger.jsonl", "rb") as f:
                f.seek(self._ledger_off)
                data = f.read()
        except FileNotFoundError:
            self._check()
            raise
        end = data.rfind(b"\n") + 1  # a torn last line is left for a later look
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn line from a writer that died: never spawned
            self._ledger.setdefault(rec["key"], rec)
        self._ledger_off += end
        return self._ledger.get(key)

    def _append_ledger(self, rec: dict[str, Any]) -> None:
        path = self._d / "ledger.jsonl"
        with open(path, "ab") as f:
            sep = b""
            if f.tell() > 0:
                with open(path, "rb") as r:
                    r.seek(-1, os.SEEK_END)
                    sep = b"" if r.read(1) == b"\n" else b"\n"
            f.write(sep + json.dumps(rec, separators=(",", ":")).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())

    # --- records ------------------------------------------------------------------------

    def _record(self, key: str, line: dict[str, Any] | None) -> ExecRecord:
        if line is None:
            return ExecRecord(key=key, state=ExecState.UNKNOWN)
        cmd_dir = self._d / "cmds" / line["cmd"]
        meta = _read_json(cmd_dir / "meta.json") or {}
        pid = meta.get("pid")
        status = _read_json(cmd_dir / "status")
        tail = _tail(cmd_dir / "output")
        epoch = line.get("epoch")
        if status is not None:
            return ExecRecord(
                key,
                ExecState.EXITED,
                epoch,
                pid,
                status.get("exit_code"),
                status.get("signal"),
                tail,
            )
        if pid is not None and _alive(pid, meta["ctime"]):
            return ExecRecord(key, ExecState.RUNNING, epoch, pid, output_tail=tail)
        if (cmd_dir / "status").exists():  # it ended between our two looks
            return self._record(key, line)
        return ExecRecord(key, ExecState.LOST, epoch, pid, output_tail=tail)

    def _record_sync(self, key: str) -> ExecRecord:
        self._check()
        line = self._ledger_line(key)
        if line is not None and not (self._d / "cmds" / line["cmd"] / "meta.json").exists():
            with self._locked():  # a spawn may be between its ledger line and its pid
                return self._record(key, self._ledger_line(key))
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
            meta = _read_json(cmd_dir / "meta.json") or {}
            return LocalExecution(
                self,
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
        return LocalExecution(self, key, cmd_dir, rec.pid, 0.0, replay=result)

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
        _reap()
        with self._locked():
            floor = self._floor()
            if epoch < floor:
                raise StaleEpochError(epoch, floor, f"Space {self.name}")
            if key is not None:
                line = self._ledger_line(key)
                if line is not None:
                    return self._existing(key, line, keep_output)
                cmd_id = "k-" + hashlib.sha256(key.encode()).hexdigest()[:32]
                self._append_ledger(
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
            with _children_lock:
                _children.add(popen)
            ctime = psutil.Process(popen.pid).create_time()
            meta = {"pid": popen.pid, "ctime": ctime, "epoch": epoch, "key": key}
            _write_atomic(cmd_dir / "meta.json", json.dumps(meta).encode(), fsync=False)
            hit("space.local.supervisor_recorded")  # dying here: the command never starts
            assert popen.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                popen.stdin.write(format_spec(self._cwd(cwd), argv, cenv))
                popen.stdin.close()
        hit("space.local.spawned")
        return LocalExecution(
            self, key, cmd_dir, popen.pid, ctime, popen=popen, epoch=epoch, keep_output=keep_output
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
    ) -> LocalExecution:
        """See ``Space.spawn``. A key whose record is ``lost`` is not run again either: it
        comes back replayed with ``exit_code=None`` (outcome unknown)."""
        if stdin is not None and key is not None:
            raise ValueError("stdin is only supported with key=None")
        if not argv:
            raise ValueError("empty argv")
        self._check()
        return await asyncio.to_thread(
            self._spawn_sync, list(argv), key, epoch, cwd, env, stdin, keep_output
        )

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
            _kill_space(self._d, self.instance_id, below_epoch=epoch)
            _write_atomic(self._d / "epoch", str(epoch).encode())

    async def advance_epoch(self, epoch: int) -> None:
        self._check()
        await asyncio.to_thread(self._advance_sync, epoch)

    async def capabilities(self) -> Capabilities:
        self._check()
        return Capabilities(
            kind="local",
            exec_ledger=True,
            machine_checkpoints=False,
            features=frozenset({EXEC_LEDGER}),
        )

    # --- files --------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        self._check()
        return local_fs.read_file(self.root, path)

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
        await self._mutate(
            epoch, lambda: local_fs.symlink(self.root, path, target, self._staging)
        )

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
            return self._scanner.scan(self.root, root, exclude)

    async def scan(self, root: str = ".", exclude: Sequence[str] = ()) -> PathTable:
        self._check()
        return await asyncio.to_thread(self._scan_sync, root, list(exclude))

    async def close(self) -> None:
        _reap()


def _space_procs(d: Path, instance: str) -> list[psutil.Process]:
    """Every live process of the Space: recorded supervisors with their trees, and any
    process carrying the Space's mark."""
    procs: dict[int, psutil.Process] = {}
    for meta_path in (d / "cmds").glob("*/meta.json"):
        meta = _read_json(meta_path)
        if meta is None or not _alive(meta["pid"], meta["ctime"]):
            continue
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(meta["pid"])
            for q in [p, *p.children(recursive=True)]:
                procs[q.pid] = q
    me = os.getpid()
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.pid != me and p.environ().get("DS_SPACE") == instance:
                procs[p.pid] = p
    return list(procs.values())


def _kill_space(d: Path, instance: str, below_epoch: int | None = None) -> None:
    """SIGKILL the Space's processes (those of an epoch below ``below_epoch`` if given)
    and wait until they are dead: recorded process groups, then anything carrying the
    Space's mark in its environment."""
    procs: list[psutil.Process] = []

    def take(p: psutil.Process) -> None:
        with contextlib.suppress(psutil.Error):
            procs.extend([p, *p.children(recursive=True)])

    for meta_path in (d / "cmds").glob("*/meta.json"):
        meta = _read_json(meta_path)
        if meta is None or (meta_path.parent / "status").exists():
            continue
        if below_epoch is not None and meta["epoch"] >= below_epoch:
            continue
        if _alive(meta["pid"], meta["ctime"]):
            take(psutil.Process(meta["pid"]))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(meta["pid"], signal.SIGKILL)  # the supervisor leads its group
    me = os.getpid()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            env = p.environ()
        except psutil.Error:
            continue
        if env.get("DS_SPACE") != instance:
            continue
        if below_epoch is not None:
            try:
                if int(env.get("DS_EPOCH", "")) >= below_epoch:
                    continue
            except ValueError:
                pass  # marked as ours with an unreadable epoch: older than any
        take(p)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    deadline = time.monotonic() + _KILL_TIMEOUT
    while not all(_dead(p) for p in procs):
        if time.monotonic() > deadline:
            raise SpaceUnavailableError(f"processes of Space {d.name} survived SIGKILL")
        time.sleep(0.005)
    _reap()


class LocalBackend:
    """Spaces as directories under ``state_dir``; see the module docstring."""

    kind = "local"

    def __init__(self, state_dir: str | Path) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)

    def _dir(self, name: str) -> Path:
        if not _NAME_RE.fullmatch(name):
            raise ConfigError(f"invalid Space name {name!r} (want [A-Za-z0-9][A-Za-z0-9._-]*)")
        return self.state_dir / name

    def _open(self, name: str) -> LocalSpace | None:
        d = self._dir(name)
        try:
            instance = (d / "instance").read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return LocalSpace(self, name, d, instance)

    def _create_sync(self, name: str) -> LocalSpace:
        d = self._dir(name)
        for _ in range(3):
            found = self._open(name)
            if found is not None:
                return found
            tmp = self.state_dir / f".creating-{uuid.uuid4().hex}"
            (tmp / "work").mkdir(parents=True)
            (tmp / "cmds").mkdir()
            for fname, data in (
                ("epoch", b"0"),
                ("ledger.jsonl", b""),
                ("lock", b""),
                ("instance", uuid.uuid4().hex.encode()),
            ):
                _write_atomic(tmp / fname, data)
            try:
                os.rename(tmp, d)
            except OSError:  # someone else created it first, or junk without an instance
                shutil.rmtree(tmp, ignore_errors=True)
                if d.exists() and not (d / "instance").exists():
                    os.rename(d, self.state_dir / f".junk-{uuid.uuid4().hex}")
                continue
            _fsync_dir(self.state_dir)
        found = self._open(name)
        if found is None:
            raise SpaceUnavailableError(f"could not create Space {name} in {self.state_dir}")
        return found

    async def create(self, name: str) -> LocalSpace:
        return await asyncio.to_thread(self._create_sync, name)

    async def find(self, name: str) -> LocalSpace | None:
        return self._open(name)

    def _restart_sync(self, name: str) -> None:
        space = self._open(name)
        if space is None:
            raise SpaceGoneError(f"Space {name} does not exist")
        with space._locked():
            _kill_space(space._d, space.instance_id)
            for cmd in (space._d / "cmds").glob("p-*"):
                shutil.rmtree(cmd, ignore_errors=True)  # unkeyed commands leave no record

    async def restart(self, name: str) -> None:
        await asyncio.to_thread(self._restart_sync, name)

    def _signal_sync(self, name: str, sig: int) -> None:
        space = self._open(name)
        if space is None:
            raise SpaceGoneError(f"Space {name} does not exist")
        for p in _space_procs(space._d, space.instance_id):
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    async def pause(self, name: str) -> None:
        """Freeze the Space's machine: every process of it is SIGSTOPped (the stand-in has
        no daemon: its file operations run in the caller and are not frozen)."""
        await asyncio.to_thread(self._signal_sync, name, signal.SIGSTOP)

    async def resume(self, name: str) -> None:
        with contextlib.suppress(SpaceGoneError):
            await asyncio.to_thread(self._signal_sync, name, signal.SIGCONT)

    async def kill_daemon(self, name: str) -> None:
        """The local stand-in has no daemon: its "daemon" is the Space's process tree, so
        this is ``restart``. Commands die with it (as with the namespaced spacesd) and
        running records read ``lost``."""
        await self.restart(name)

    def _delete_sync(self, name: str) -> None:
        space = self._open(name)
        d = self._dir(name)
        if space is not None:
            with space._locked():
                _kill_space(d, space.instance_id)
                tomb = self.state_dir / f".deleted-{uuid.uuid4().hex}"
                os.rename(d, tomb)
            shutil.rmtree(tomb, ignore_errors=True)
        elif d.exists():
            shutil.rmtree(d, ignore_errors=True)

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self._delete_sync, name)

    async def names(self) -> list[str]:
        return sorted(
            p.name
            for p in self.state_dir.iterdir()
            if not p.name.startswith(".") and (p / "instance").exists()
        )

    async def close(self) -> None:
        _reap()
