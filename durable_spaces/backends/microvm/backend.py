"""microvm Spaces: one QEMU guest per Space running the real cua-spacesd, with
whole-machine checkpoints (memory and disk), restores and forks.

The guest image and its booted base checkpoint come from ``make microvm-image``
(``microvm_image``); QEMU mechanics live in ``qemu_vm``. The client side is the spacesd
backend's ``SpacesdSpace`` pointed at the forwarded loopback port, workspace
``/home/cua/work``, user ``cua``: one client for every daemon.

Layout under ``state_dir``::

    spaces/<name>/state.json   port, QEMU pid + start time, disk chain, instance id, boot id
    spaces/<name>/token        the Space's token (0600); fw_cfg hands it to a cold boot
    spaces/<name>/{qemu,console}.log
    disks/<id>.qcow2           every qcow2 layer (a pool: chains share frozen layers)
    checkpoints/<id>/          memory or memory.zst (0400), meta.json, token (0400)

A Space is created as a *fork* of the image's booted base checkpoint: a new qcow2 layer
over the base's frozen disk plus ``-incoming`` of its memory (about half a second of
QEMU work, against a cold boot of about six seconds or more under TCG). A fork starts
with the image's token in guest memory, so the backend at once rotates it to the Space's
own (the daemon runs ``--await-token-file`` on ``/run/cua/env-token``), sets the guest
clock (it resumes from the checkpoint's instant) and mixes host randomness into the
guest's pool (forks share random state; with no VM generation ID driver in the cloud
kernel the CRNG picks it up on its next reseed, not at once).

Faults, as this backend implements them:

- ``restart``: ``sync`` in the guest (best effort), SIGKILL of QEMU, cold boot of the
  Space's current top layer. No process survives; finished records and the epoch floor
  survive (the ledger is on the guest disk and the daemon fsyncs it); running records read
  ``LOST``.
- ``kill_daemon``: SIGKILL of the daemon inside the guest. The guest's pid 1 (a bash loop,
  ``/sbin/cua-init``) starts a new one at once. Commands that were running SURVIVE as
  orphans of pid 1 and read ``LOST``; with ``sweep_orphans`` ``advance_epoch`` kills such
  orphans (as docker does) because the daemon only kills the commands it tracks. It is
  off by default: a process an agent left running is machine state that checkpoints keep.
- ``delete``: SIGKILL of QEMU and removal of the Space's files and of disk layers no
  checkpoint needs.

Machine checkpoints (``checkpoint``/``restore``/``fork``/``prune``) live with the backend,
outside the Space, on this machine: another machine cannot restore them (it needs
workspace snapshots with a shared store). Checkpoint files are immutable (0400) once
written. ``prune_space(name, keep)`` deletes a Space's checkpoints not in ``keep`` (the
adapter passes every checkpoint its log still records, after each checkpoint commit) and
never the one a living Space was restored or forked from; ``prune(keep)`` does the same
for all Spaces; ``keep_checkpoints`` is an optional age bound for callers without a log.
Disk layers go when no Space and no checkpoint refers to them. Each checkpoint adds one
frozen layer to the Space's disk chain; a long chain reads a little slower (no
block-commit is done). ``restore`` of a Space that was removed places it again from the
checkpoint (a new instance). After a restore the daemon's in-memory state, its ledger and
its epoch floor are those of the checkpoint: the caller raises the epoch before anything
runs.

A driver killed half-way is finished by the next ``find``/``create``: a machine left
stopped inside a checkpoint is continued (its disk top, if the snapshot switched it, is
recorded), one left loading a restore is continued, and a fork that never got its own
token is given it (``SpaceState.pending``).

Checkpoints and Spaces refer to the image they were made from by absolute path. After
``make microvm-image`` rebuilt the image (new hash), running Spaces keep working and cold
boots use the new kernel, but restoring an older checkpoint is refused (another QEMU,
kernel or base); the old image directory must stay until its Spaces are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
import re
import secrets
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from durable_spaces.adapter.checkpoint_id import CheckpointId
from durable_spaces.backends.microvm import qemu as qemu_vm
from durable_spaces.backends.microvm.image import (
    DEFAULT_MEMORY_MB,
    WORKSPACE,
    GuestImage,
    load_image,
)
from durable_spaces.backends.spacesd import space as spacesd_space
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import (
    BackendUnavailableError,
    SpaceError,
    SpaceGoneError,
    SpaceUnavailableError,
    StaleEpochError,
)
from durable_spaces.space import Capabilities

__all__ = ["MicrovmBackend", "MicrovmSpace", "unavailable_reason"]

USER = "cua"
TOKEN_PATH = "/run/cua/env-token"
_NAME_OK = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
#: Daemon file operations that take ``user=`` (``upload`` takes it in its options).
_FILE_OPS = frozenset({"download", "make_dir", "remove", "stat", "list_dir", "move_path"})

# Kills, as root in the guest, every process that is neither pid 1 nor under the current
# daemon: what remains of a killed daemon's commands, and background leftovers.
_SWEEP = spacesd_space.orphan_sweep_script("cat /run/cua/daemon.pid 2>/dev/null")


def unavailable_reason(image_dir: str | os.PathLike[str] | None = None) -> str | None:
    """None when microvm Spaces can run here; otherwise why not (for a test skip)."""
    for tool in ("qemu-system-x86_64", "qemu-img"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (images/microvm/ci-setup.sh)"
    img = load_image(pathlib.Path(image_dir) if image_dir else None)
    if img is None:
        return "the microvm image is not built: run make microvm-image"
    if not any(img.dir.glob("base-*m/done")):
        return "the microvm base checkpoint is missing: run make microvm-image"
    return None


@dataclass
class SpaceState:
    """What ``spaces/<name>/state.json`` holds."""

    instance_id: str
    port: int
    created: float
    chain: list[str] = field(default_factory=list)  # disk layers, bottom first; last = top
    pid: int = 0
    pid_start: float = 0.0
    boot: str = ""  # changes whenever the daemon (or the machine) is started anew
    booted: float = 0.0
    #: The checkpoint this machine was last restored or forked from (never pruned while
    #: this Space lives).
    restored_from: str = ""
    #: Token file of the checkpoint being restored while its token is still the one in
    #: guest memory (a driver killed before the rotation leaves it set: find() finishes).
    pending: str = ""
    #: The host's copy of the epoch floor. The guest's floor lives on its disk and rolls
    #: back with every restore; this one does not, so a stale restore or checkpoint is
    #: refused here, and a restored guest is raised to it before anyone else reaches it.
    floor: int = 0
    #: Frozen by ``pause`` (QMP stop) until ``resume``: a find() leaves it stopped.
    frozen: bool = False


@dataclass
class CheckpointMeta:
    id: str
    space: str
    created: float
    chain: list[str]
    memory_mb: int
    accel: str
    image: str
    pause_s: float = 0.0
    memory_bytes: int = 0


@dataclass(frozen=True)
class _Source:
    """What a machine is restored from: memory, the frozen disk top, the token in memory."""

    memory: pathlib.Path
    chain: list[str]
    token_file: pathlib.Path

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()


class VmProbe:
    """``DaemonProbe`` of one Space instance, read from its state file (cheap: it is asked
    around every output event)."""

    def __init__(self, backend: MicrovmBackend, name: str, instance_id: str) -> None:
        self._b = backend
        self._name = name
        self._instance = instance_id

    def boot_id(self) -> str | None:
        st = self._b._read(self._name)
        if st is None or st.instance_id != self._instance:
            return None
        if not qemu_vm.alive(st.pid, st.pid_start):
            return None
        return f"{st.pid}:{st.boot}"

    def gone(self) -> bool:
        st = self._b._read(self._name)
        return st is None or st.instance_id != self._instance


def _spacesd_space_cls() -> type[Any]:
    from durable_spaces.backends.spacesd.space import SpacesdSpace

    return SpacesdSpace


def _make_space_class() -> type[Any]:
    base = _spacesd_space_cls()

    class MicrovmSpace(base):  # type: ignore[misc, valid-type]
        """A cua-spacesd Space inside a QEMU guest, reached on its forwarded port."""

        def __init__(self, backend: MicrovmBackend, name: str, st: SpaceState, token: str) -> None:
            super().__init__(
                name,
                WORKSPACE,
                st.instance_id,
                f"http://127.0.0.1:{st.port}",
                token,
                VmProbe(backend, name, st.instance_id),
                kind="microvm",
                user=USER,
                sdk_home=str(backend._sdk_home()),
            )
            self._backend = backend
            self.port = st.port

        def __repr__(self) -> str:  # never shows the token
            return f"MicrovmSpace({self.name!r}, port={self.port})"

        async def _call(self, method: str, *args: Any, **kw: Any) -> Any:
            if self._user is not None:
                if method in _FILE_OPS:
                    kw.setdefault("user", self._user)
                elif method == "upload" and len(args) >= 3 and args[2] is not None:
                    args[2].user = self._user
            return await super()._call(method, *args, **kw)

        async def capabilities(self) -> Capabilities:
            caps = await super().capabilities()
            return dataclasses.replace(caps, kind="microvm", machine_checkpoints=True)

        async def root_run(self, script: str, *args: str) -> tuple[int | None, bytes]:
            """A ledger-less shell script as root in the guest (not fenced)."""
            import cua

            cmd = cua.SpacesdCommand(
                program="sh", args=["-c", script, "sh", *args], cwd="/", epoch=0
            )
            out = await self._call("run", cmd)
            code = out.exit.code if out.exit is not None else None
            return code, bytes(out.stdout or b"") + bytes(out.stderr or b"")

        async def current_epoch(self) -> int:
            st = self._backend._read(self.name)
            host = st.floor if st is not None and st.instance_id == self.instance_id else 0
            return max(host, await super().current_epoch())

        async def advance_epoch(self, epoch: int) -> None:
            # Under the Space's lock, so a restore (which replaces the machine and its
            # floor) is wholly before or after this advance, never around it.
            async with self._backend._lock(self.name):
                self._backend._raise_floor(self.name, self.instance_id, epoch)
                await self._advance_guest(epoch)

        async def _advance_guest(self, epoch: int) -> None:
            before = await super().current_epoch()
            if epoch < before:
                raise StaleEpochError(epoch, before, "space")
            await super().advance_epoch(epoch)
            if epoch > before and self._backend.sweep_orphans:
                code, out = await self.root_run(_SWEEP)
                if code not in (0, None):
                    raise self._down(f"sweeping stray processes failed: {out[-200:]!r}")

    return MicrovmSpace


_space_cls: type[Any] | None = None


def MicrovmSpace(backend: MicrovmBackend, name: str, st: SpaceState, token: str) -> Any:
    """Build a microvm Space (the class subclasses ``SpacesdSpace``, imported on use)."""
    global _space_cls
    if _space_cls is None:
        _space_cls = _make_space_class()
    return _space_cls(backend, name, st, token)


async def _guest(sp: Any, script: str, *args: str, timeout: float = 10) -> tuple[int | None, bytes]:
    """A root script in the guest with a deadline: a daemon going away under a call must
    not hang a backend operation."""
    return await asyncio.wait_for(sp.root_run(script, *args), timeout)


class MicrovmBackend:
    """QEMU microvm guests as Spaces, under ``state_dir``.

    ``image_dir``: a built image (default ``~/.cache/durable-spaces-microvm/current``);
    ``memory_mb``: guest memory (a base checkpoint must exist for it);
    ``keep_checkpoints``: keep only this many newest checkpoints per Space, plus the one
    the Space was last restored from (``DS_MICROVM_KEEP_CHECKPOINTS``, default 0: keep
    all until pruned). The adapter prunes by its log (``prune_space``), which is exact: an
    age bound could drop a checkpoint a fork's log still needs. Set it only when driving
    the backend without the adapter.
    ``compress``: zstd the memory files (``DS_MICROVM_COMPRESS``, default on): about 45 MB
    instead of 120 MB for 512 MiB, for a pause of about 0.45 s instead of 0.14 s (TCG).
    """

    kind = "microvm"

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        image_dir: str | os.PathLike[str] | None = None,
        memory_mb: int = DEFAULT_MEMORY_MB,
        keep_checkpoints: int | None = None,
        compress: bool | None = None,
        sweep_orphans: bool | None = None,
    ) -> None:
        if sweep_orphans is None:
            sweep_orphans = os.environ.get("DS_MICROVM_SWEEP_ORPHANS", "") not in ("", "0")
        #: Kill processes the daemon does not track when the epoch rises. Off by default:
        #: on a machine-checkpointed Space a process left running (a server) is state that
        #: checkpoints keep and restores bring back, and a restore replaces the whole
        #: machine, so no stray writer outlives it. On for transactional use, where a
        #: stray writer from an older epoch could change the workspace after a revert.
        self.sweep_orphans = sweep_orphans
        if compress is None:
            compress = os.environ.get("DS_MICROVM_COMPRESS", "1") not in ("", "0")
        #: zstd the memory files (about a quarter of the size, a longer pause).
        self.compress = compress
        if keep_checkpoints is None:
            keep_checkpoints = int(os.environ.get("DS_MICROVM_KEEP_CHECKPOINTS", "0"))
        self.keep_checkpoints = keep_checkpoints
        reason = unavailable_reason(image_dir)
        if reason is not None:
            raise BackendUnavailableError(reason)
        img = load_image(pathlib.Path(image_dir) if image_dir else None)
        assert img is not None
        self.image: GuestImage = img
        self.memory_mb = memory_mb
        base = img.base_checkpoint(memory_mb)
        if base is None:
            raise BackendUnavailableError(
                f"no base checkpoint for {memory_mb} MiB in {img.dir}: "
                f"DS_MICROVM_MEMORY_MB={memory_mb} make microvm-image"
            )
        self._base_memory, self._base_disk = base
        self.state_dir = pathlib.Path(state_dir).absolute()
        for d in ("spaces", "disks", "checkpoints", ".locks"):
            (self.state_dir / d).mkdir(parents=True, exist_ok=True)
        self.accel = qemu_vm.choose_accel(img)
        spec = json.loads((img.base_dir(memory_mb) / "spec.json").read_text())
        if spec.get("accel") != self.accel.name:
            raise BackendUnavailableError(
                f"the base checkpoint was made under {spec.get('accel')}, "
                f"guests here run under {self.accel.name}: rebuild it"
            )
        self.spec = qemu_vm.VmSpec(img, memory_mb, self.accel)
        self._spaces: dict[str, Any] = {}
        self._alocks: dict[tuple[int, str], asyncio.Lock] = {}
        #: Figures of the last operations, for benchmarks: seconds.
        self.last: dict[str, float] = {}

    # --- files and locks ------------------------------------------------------------------

    def _sdk_home(self) -> pathlib.Path:
        home = self.state_dir / ".cua-sdk"
        home.mkdir(mode=0o700, exist_ok=True)
        return home

    def _home(self, name: str) -> pathlib.Path:
        if not _NAME_OK.match(name):
            raise ValueError(f"bad Space name {name!r}: [a-z0-9-], at most 63")
        return self.state_dir / "spaces" / name

    def _qmp_sock(self, name: str) -> pathlib.Path:
        # unix socket paths are limited to 108 bytes: keep them short, unique per Space.
        h = hashlib.sha256(str(self._home(name)).encode()).hexdigest()[:16]
        return pathlib.Path("/tmp") / f"ds-qmp-{h}.sock"

    def _read(self, name: str) -> SpaceState | None:
        try:
            return SpaceState(**json.loads((self._home(name) / "state.json").read_text()))
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
            return None

    def _write(self, name: str, st: SpaceState) -> None:
        path = self._home(name) / "state.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(asdict(st), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _token(self, name: str) -> str:
        return (self._home(name) / "token").read_text().strip()

    def _raise_floor(self, name: str, instance_id: str | None, epoch: int | None) -> SpaceState:
        """The host floor check of a mutation by ``epoch`` (caller holds the Space's lock):
        refused below the floor, raised above it. ``epoch`` None is the backend's own
        operation (placement, faults), which is not fenced."""
        st = self._read(name)
        if st is None or (instance_id is not None and st.instance_id != instance_id):
            raise SpaceGoneError(f"no Space {name!r}")
        if epoch is not None:
            if epoch < st.floor:
                raise StaleEpochError(epoch, st.floor, f"Space {name}")
            if epoch > st.floor:
                st.floor = epoch
                self._write(name, st)
        return st

    @contextlib.asynccontextmanager
    async def _lock(self, what: str) -> AsyncIterator[None]:
        """Serialize operations on one Space (or the disk pool) across processes and
        across tasks of this process.

        flock alone is not enough: two tasks of one event loop would each open the file
        and the second flock would block the loop's thread while the first holds it (a
        nemesis restarting a Space while the coordinator finds it deadlocked that way).
        So tasks queue on an asyncio lock first, and the flock is taken in a thread."""
        loop = asyncio.get_running_loop()
        key = (id(loop), what)
        alock = self._alocks.get(key)
        if alock is None:
            alock = self._alocks[key] = asyncio.Lock()
        async with alock:
            path = self.state_dir / ".locks" / f"{what}.lock"
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _new_layer(self, backing: str) -> str:
        path = self.state_dir / "disks" / f"{uuid.uuid4().hex}.qcow2"
        qemu_vm.create_overlay(path, pathlib.Path(backing))
        return str(path)

    # --- machines -------------------------------------------------------------------------

    def _base_source(self) -> _Source:
        return _Source(self._base_memory, [str(self._base_disk)], self.image.token_file)

    async def _start(self, name: str, st: SpaceState, source: _Source | None) -> SpaceState:
        """Start the Space's machine on ``st.chain``'s top: a restore of ``source`` (its
        memory; the top must be a fresh layer over ``source.chain``) or a cold boot.
        Caller holds the Space's lock; returns once the daemon answers with the Space's
        token, the guest clock set."""
        home = self._home(name)
        sock = self._qmp_sock(name)
        qemu_vm.kill_strays(sock)
        for attempt in range(3):
            argv = qemu_vm.qemu_argv(
                self.spec,
                disk=pathlib.Path(st.chain[-1]),
                port=st.port,
                token_file=home / "token",
                run_dir=home,
                qmp_sock=sock,
                incoming=source.memory if source else None,
            )
            t0 = time.monotonic()
            vm = qemu_vm.launch(argv, home, sock)
            hit("microvm.start.spawned")  # a machine not recorded yet: kill_strays' case
            st.pid, st.pid_start = vm.pid, vm.start
            st.boot = secrets.token_hex(6)
            st.booted = time.time()
            st.pending = str(source.token_file) if source is not None else ""
            self._write(name, st)
            timeout = qemu_vm.RESTORE_TIMEOUT if source else qemu_vm.BOOT_TIMEOUT
            hit("microvm.start.launched")
            try:
                if source is not None:
                    self.last["load"] = await qemu_vm.resume_incoming(sock, vm, timeout)
                await qemu_vm.wait_health(st.port, timeout, vm, home)
                break
            except SpaceUnavailableError as e:
                qemu_vm.kill(vm.pid, vm.start)
                if "hostfwd" in str(e) or "host forwarding" in str(e):
                    from durable_spaces.backends.spacesd.daemon import free_port

                    if attempt < 2:
                        st.port = free_port()  # the port was taken meanwhile
                        continue
                raise
        key = "restore" if source else "boot"
        self.last[key] = time.monotonic() - t0
        if source is not None:
            hit("microvm.start.resumed")
            self._spaces[name] = await self._after_restore(name, st, source.token)
            st.pending = ""
            self._write(name, st)
        self.last[key + "_ready"] = time.monotonic() - t0
        return st

    async def _after_restore(self, name: str, st: SpaceState, old_token: str) -> Any:
        """Give the restored guest the Space's token, the host's clock and fresh randomness;
        returns the connected Space (its connection is reused)."""
        token = self._token(name)
        tmp = MicrovmSpace(self, name, st, old_token)
        script = (
            'date -s "@$1" >/dev/null; printf %s "$2" > /dev/urandom; '
            'if [ "$3" != same ]; then umask 077; printf %s "$3" > /run/cua/env-token.new '
            "&& mv /run/cua/env-token.new /run/cua/env-token; fi"
        )
        rotate = token != old_token
        try:
            await tmp.root_run(
                script, f"{time.time():.6f}", secrets.token_hex(32), token if rotate else "same"
            )
        except SpaceUnavailableError:
            if not rotate:
                raise
        if not rotate:
            return tmp
        with contextlib.suppress(Exception):
            await tmp.close()
        # The daemon picks the file up on its own (inotify): wait until the new token works.
        sp = MicrovmSpace(self, name, st, token)
        deadline = time.monotonic() + 10
        while True:
            try:
                await sp._call("capabilities")
                return sp
            except SpaceUnavailableError:
                if time.monotonic() > deadline:
                    raise
                sp._client = None
                await asyncio.sleep(0.02)

    def _space(self, name: str, st: SpaceState) -> Any:
        sp = self._spaces.get(name)
        if sp is not None and sp.instance_id == st.instance_id and sp.port == st.port:
            return sp
        sp = MicrovmSpace(self, name, st, self._token(name))
        self._spaces[name] = sp
        return sp

    def _drop(self, name: str) -> None:
        sp = self._spaces.pop(name, None)
        if sp is not None:
            sp._client = None

    def _init_space(self, name: str) -> SpaceState:
        from durable_spaces.backends.spacesd.daemon import free_port

        home = self._home(name)
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(home / "token", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))  # the same length as every token: fw_cfg size
        return SpaceState(instance_id=secrets.token_hex(8), port=free_port(), created=time.time())

    async def _fork_into(self, name: str, source: _Source, origin: str = "") -> Any:
        """A new Space ``name`` as a fork of ``source`` (caller holds the lock); ``origin``
        is the checkpoint id it came from (kept from pruning while the Space lives)."""
        st = self._init_space(name)
        st.restored_from = origin
        async with self._lock("pool"):
            st.chain = [*source.chain, self._new_layer(source.chain[-1])]
            self._write(name, st)
        try:
            st = await self._start(name, st, source)
        except BaseException:
            self._kill(name)
            raise
        return self._space(name, st)

    def _kill(self, name: str) -> None:
        st = self._read(name)
        if st is not None:
            qemu_vm.kill(st.pid, st.pid_start)
        self._drop(name)

    # --- SpaceBackend -------------------------------------------------------------------------

    async def create(self, name: str) -> Any:
        async with self._lock(name):
            st = self._read(name)
            if st is not None:
                return await self._ensure_running(name, st)
            return await self._fork_into(name, self._base_source())

    async def _ensure_running(self, name: str, st: SpaceState) -> Any:
        """The Space, running: a machine that is down (host reboot, QEMU crash) boots its
        disk, as a machine would; one left half-way by a killed driver is finished."""
        if not qemu_vm.alive(st.pid, st.pid_start):
            st.pending = ""  # a cold boot takes the Space's own token from fw_cfg
            st.frozen = False
            st = await self._start(name, st, None)
            return self._space(name, st)
        if st.frozen:
            return self._space(name, st)  # paused on purpose: it answers once resumed
        top = await qemu_vm.settle(self._qmp_sock(name))
        if top is not None and top != st.chain[-1]:
            # Killed between the disk snapshot and recording it: the new top is real.
            if top in st.chain:
                raise SpaceError(f"the machine of {name!r} writes to {top}, not its chain's top")
            st.chain.append(top)
            self._write(name, st)
        if st.pending:
            old = pathlib.Path(st.pending).read_text().strip()
            await qemu_vm.wait_health(st.port, qemu_vm.RESTORE_TIMEOUT)
            self._spaces[name] = await self._after_restore(name, st, old)
            st.pending = ""
            self._write(name, st)
        return self._space(name, st)

    async def find(self, name: str) -> Any:
        async with self._lock(name):
            st = self._read(name)
            if st is None:
                return None
            return await self._ensure_running(name, st)

    async def restart(self, name: str) -> None:
        async with self._lock(name):
            st = self._read(name)
            if st is None:
                raise SpaceError(f"no Space {name!r} to restart")
            if qemu_vm.alive(st.pid, st.pid_start):
                # Files written by commands may sit in the guest's page cache: flush them,
                # as a clean reboot would (the ledger itself is fsynced by the daemon).
                sp = self._space(name, st)
                with contextlib.suppress(Exception):
                    await _guest(sp, "sync", timeout=15)
            self._kill(name)
            await self._start(name, st, None)

    async def pause(self, name: str) -> None:
        """Freeze the whole machine (QMP ``stop``): every vCPU halts, the daemon with it."""
        async with self._lock(name):
            st = self._read(name)
            if st is None:
                raise SpaceGoneError(f"no Space {name!r}")
            if qemu_vm.alive(st.pid, st.pid_start):
                st.frozen = True  # so a find() meanwhile does not continue it (settle)
                self._write(name, st)
                await qemu_vm.qmp_run(self._qmp_sock(name), "stop")

    async def resume(self, name: str) -> None:
        async with self._lock(name):
            st = self._read(name)
            if st is not None and st.frozen:
                st.frozen = False
                self._write(name, st)
                if qemu_vm.alive(st.pid, st.pid_start):
                    await qemu_vm.qmp_run(self._qmp_sock(name), "cont")

    async def kill_daemon(self, name: str) -> None:
        async with self._lock(name):
            st = self._read(name)
            if st is None:
                raise SpaceGoneError(f"no Space {name!r}")
            sp = await self._ensure_running(name, st)
            st = self._read(name) or st
            code, before = await _guest(sp, "cat /run/cua/daemon.pid")
            st.boot = secrets.token_hex(6)
            self._write(name, st)  # waiters must see a new daemon from now on
            # Detached, so the kill does not cut its own answer short.
            with contextlib.suppress(SpaceUnavailableError, TimeoutError):
                await _guest(
                    sp, '(sleep 0.05; kill -9 "$1") >/dev/null 2>&1 &', before.strip().decode()
                )
            sp._client = None
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(SpaceUnavailableError, TimeoutError):
                    code, now = await _guest(sp, "cat /run/cua/daemon.pid")
                    if code == 0 and now.strip() and now.strip() != before.strip():
                        break
                sp._client = None
                if time.monotonic() > deadline:
                    raise SpaceUnavailableError(f"the daemon of {name!r} did not come back")
                await asyncio.sleep(0.05)

    async def delete(self, name: str) -> None:
        async with self._lock(name):
            st = self._read(name)
            if st is not None:
                qemu_vm.kill(st.pid, st.pid_start)
            self._drop(name)
            shutil.rmtree(self._home(name), ignore_errors=True)
            self._qmp_sock(name).unlink(missing_ok=True)
        await self._gc()

    async def names(self) -> list[str]:
        return sorted(
            p.name
            for p in (self.state_dir / "spaces").iterdir()
            if _NAME_OK.match(p.name) and (p / "state.json").exists()
        )

    async def close(self) -> None:
        for sp in list(self._spaces.values()):
            with contextlib.suppress(Exception):
                await sp.close()
        self._spaces.clear()

    # --- machine checkpoints ------------------------------------------------------------------

    def _ckpt_dir(self, checkpoint_id: str) -> pathlib.Path:
        # ``BadCheckpointIdError`` (a ValueError) for anything but 24 hex digits: an id
        # from a log never becomes a path outside ``checkpoints/``.
        cid = CheckpointId.parse(checkpoint_id, "a microvm checkpoint", "machine")
        return self.state_dir / "checkpoints" / cid

    def checkpoint_meta(self, checkpoint_id: str) -> CheckpointMeta:
        d = self._ckpt_dir(checkpoint_id)
        try:
            return CheckpointMeta(**json.loads((d / "meta.json").read_text()))
        except FileNotFoundError:
            raise SpaceError(f"no checkpoint {checkpoint_id!r}") from None

    async def checkpoints(self) -> list[str]:
        return sorted(
            p.name
            for p in (self.state_dir / "checkpoints").iterdir()
            if CheckpointId.valid(p.name, "machine") and (p / "meta.json").exists()
        )

    async def checkpoint(self, name: str, epoch: int | None = None) -> str:
        """Checkpoint the whole machine (memory and disk) of Space ``name``; returns the id.
        The guest pauses for the memory copy only (a fraction of a second). ``epoch``
        fences it (a stale driver's checkpoint is refused)."""
        async with self._lock(name):
            st = self._raise_floor(name, None, epoch)
            if not qemu_vm.alive(st.pid, st.pid_start):
                raise SpaceUnavailableError(f"the machine of Space {name!r} is not running")
            cid = secrets.token_hex(12)
            d = self._ckpt_dir(cid)
            part = d.with_name(d.name + ".part")
            part.mkdir(mode=0o700)
            new_top = self.state_dir / "disks" / f"{uuid.uuid4().hex}.qcow2"
            async with self._lock("pool"):
                mem = part / ("memory.zst" if self.compress else "memory")
                figs = await qemu_vm.save_checkpoint(self._qmp_sock(name), mem, new_top)
                frozen = list(st.chain)
                st.chain = [*frozen, str(new_top)]
                self._write(name, st)
            with contextlib.suppress(OSError):
                pathlib.Path(frozen[-1]).chmod(0o400)  # never written again
            tok = part / "token"
            fd = os.open(tok, os.O_CREAT | os.O_WRONLY, 0o400)
            with os.fdopen(fd, "w") as f:
                f.write(self._token(name))
            meta = CheckpointMeta(
                id=cid,
                space=name,
                created=time.time(),
                chain=frozen,
                memory_mb=self.memory_mb,
                accel=self.accel.name,
                image=str(self.image.dir),
                pause_s=figs.pause_s,
                memory_bytes=figs.memory_bytes,
            )
            (part / "meta.json").write_text(json.dumps(asdict(meta)))
            (part / "meta.json").chmod(0o400)
            part.rename(d)
            self.last["checkpoint_pause"] = figs.pause_s
            self.last["checkpoint_bytes"] = float(figs.memory_bytes)
        await self._retain(name)
        return cid

    def _source(self, checkpoint_id: str) -> _Source:
        meta = self.checkpoint_meta(checkpoint_id)
        if (meta.memory_mb, meta.accel, meta.image) != (
            self.memory_mb,
            self.accel.name,
            str(self.image.dir),
        ):
            raise SpaceError(
                f"checkpoint {checkpoint_id} was taken with {meta.memory_mb} MiB/{meta.accel}/"
                f"{meta.image}; this backend runs {self.memory_mb} MiB/{self.accel.name}/"
                f"{self.image.dir}"
            )
        d = self._ckpt_dir(checkpoint_id)
        mem = d / "memory.zst" if (d / "memory.zst").exists() else d / "memory"
        return _Source(mem, meta.chain, d / "token")

    async def restore(self, name: str, checkpoint_id: str, epoch: int | None = None) -> Any:
        """Replace Space ``name`` with a fork of the checkpoint (same name, instance and
        token). Its processes come back as they were.

        Fenced by ``epoch`` against the host floor (a stale driver's restore is refused
        and changes nothing). The restored guest comes back on a new port and has its
        floor raised to the host's before the lock is released: the checkpoint's older
        floor is never reachable, even by a stale client that kept a connection.

        A Space that no longer exists (removed, lost) is placed again from the checkpoint:
        a new instance (new id and token) with the checkpoint's machine in it."""
        from durable_spaces.backends.spacesd.daemon import free_port

        source = self._source(checkpoint_id)
        async with self._lock(name):
            st = self._read(name)
            if st is None:
                sp = await self._fork_into(name, source, checkpoint_id)
                if epoch is not None:
                    self._raise_floor(name, None, epoch)
                    await sp._advance_guest(epoch)
                await self._gc()
                return sp
            st = self._raise_floor(name, None, epoch)
            self._kill(name)
            async with self._lock("pool"):
                st.chain = [*source.chain, self._new_layer(source.chain[-1])]
                st.restored_from = checkpoint_id
                st.port = free_port()
                self._write(name, st)
            st = await self._start(name, st, source)
            sp = self._space(name, st)
            if st.floor:
                await sp._advance_guest(st.floor)
        await self._gc()
        return sp

    async def fork(self, checkpoint_id: str, new_name: str) -> Any:
        """A new Space ``new_name`` running from the checkpoint (its own token, port and
        instance); the checkpoint's Space is untouched."""
        source = self._source(checkpoint_id)
        async with self._lock(new_name):
            if self._read(new_name) is not None:
                raise SpaceError(f"a Space {new_name!r} already exists")
            return await self._fork_into(new_name, source, checkpoint_id)

    async def prune(self, keep: set[str]) -> list[str]:
        """Delete every checkpoint not in ``keep`` and the disk layers nothing refers to;
        returns the ids removed."""
        return await self._prune(keep, space=None)

    async def prune_space(self, name: str, keep: set[str]) -> list[str]:
        """Delete Space ``name``'s checkpoints not in ``keep`` (the ones no recorded
        checkpoint refers to), except one a living Space was restored or forked from;
        returns the ids removed. Other Spaces' checkpoints are not touched."""
        return await self._prune(keep, space=name)

    async def _prune(self, keep: set[str], space: str | None) -> list[str]:
        in_use = {st.restored_from for st in self._states() if st.restored_from}
        removed = []
        for cid in await self.checkpoints():
            if cid in keep or (space is not None and cid in in_use):
                continue
            if space is not None:
                try:
                    if self.checkpoint_meta(cid).space != space:
                        continue
                except (SpaceError, OSError, ValueError, TypeError):
                    continue  # being pruned by someone else, or not ours to judge
            self._remove_checkpoint(cid)
            removed.append(cid)
        await self._gc()
        return removed

    def _states(self) -> list[SpaceState]:
        out = []
        for p in (self.state_dir / "spaces").iterdir():
            st = self._read(p.name) if _NAME_OK.match(p.name) else None
            if st is not None:
                out.append(st)
        return out

    def _remove_checkpoint(self, cid: str) -> None:
        d = self._ckpt_dir(cid)
        trash = d.with_name(d.name + ".del")
        with contextlib.suppress(OSError):
            d.rename(trash)  # atomic: from here on nobody lists or restores it
        self._remove_trash(trash)

    @staticmethod
    def _remove_trash(trash: pathlib.Path) -> None:
        with contextlib.suppress(OSError):
            for f in trash.iterdir():
                f.chmod(0o600)
        shutil.rmtree(trash, ignore_errors=True)

    async def _retain(self, name: str) -> None:
        """Apply ``keep_checkpoints``: drop this Space's oldest checkpoints beyond it."""
        if not self.keep_checkpoints:
            return
        mine = []
        for p in (self.state_dir / "checkpoints").iterdir():
            if not CheckpointId.valid(p.name, "machine"):
                continue  # being written (.part) or deleted (.del)
            with contextlib.suppress(OSError, ValueError, KeyError):
                meta = json.loads((p / "meta.json").read_text())
                if meta["space"] == name:
                    mine.append((float(meta["created"]), p.name))
        mine.sort()
        st = self._read(name)
        protected = st.restored_from if st is not None else ""
        for _, cid in mine[: max(0, len(mine) - self.keep_checkpoints)]:
            if cid != protected:
                self._remove_checkpoint(cid)
        await self._gc()

    async def _gc(self) -> None:
        """Remove pool layers that no Space chain and no checkpoint refers to."""
        async with self._lock("pool"):
            used: set[str] = set()
            for st in self._states():
                used.update(st.chain)
            for p in (self.state_dir / "checkpoints").iterdir():
                if not CheckpointId.valid(p.name, "machine"):
                    continue  # being written (.part) or deleted (.del)
                with contextlib.suppress(OSError, ValueError, TypeError):
                    used.update(json.loads((p / "meta.json").read_text())["chain"])
            cutoff = time.time() - 5  # a layer being created right now has no owner yet
            for layer in (self.state_dir / "disks").glob("*.qcow2"):
                if str(layer) not in used and layer.stat().st_mtime < cutoff:
                    layer.unlink(missing_ok=True)
            for p in (self.state_dir / "checkpoints").glob("*.part"):
                if p.stat().st_mtime < cutoff - 600:
                    shutil.rmtree(p, ignore_errors=True)
            for p in (self.state_dir / "checkpoints").glob("*.del"):
                self._remove_trash(p)  # a prune killed half-way

    # --- helpers for tests and benchmarks ---------------------------------------------------

    def qemu_pid(self, name: str) -> int | None:
        st = self._read(name)
        return st.pid if st is not None and qemu_vm.alive(st.pid, st.pid_start) else None

    def env_for(self, name: str) -> Mapping[str, str]:
        st = self._read(name)
        return {"port": str(st.port)} if st else {}

    def layers(self, name: str) -> Sequence[str]:
        st = self._read(name)
        return list(st.chain) if st else []
