"""microvm Spaces: one QEMU guest per Space running the real cua-spacesd, with
whole-machine checkpoints (memory and disk), restores and forks.

The guest image and its booted base checkpoint come from ``make microvm-image``
(``image``, ``base``; ``guest`` reads them); QEMU mechanics live in ``qemu``, the choice
of accelerator in ``accel``. This module is the backend's face; its parts are ``state``
(each Space's record, lock and host floor), ``machines`` (starting, finishing, forking
and killing machines), ``checkpoints`` (checkpoint files and the disk pool) and
``microvm_space`` (the client side: the spacesd backend's ``SpacesdSpace`` pointed at the
forwarded loopback port, workspace ``/home/cua/work``, user ``cua``).

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
import os
import pathlib
import secrets
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from durable_spaces.backends.microvm import qemu
from durable_spaces.backends.microvm.accel import choose_accel
from durable_spaces.backends.microvm.checkpoints import (
    CheckpointFiles,
    CheckpointMeta,
    checkpoint_dir,
)
from durable_spaces.backends.microvm.guest import DEFAULT_MEMORY_MB, GuestImage, load_image
from durable_spaces.backends.microvm.machines import Machines, Source
from durable_spaces.backends.microvm.microvm_space import DAEMON_PID, MicrovmSpace
from durable_spaces.backends.microvm.state import StateFiles
from durable_spaces.errors import (
    BackendUnavailableError,
    SpaceError,
    SpaceGoneError,
    SpaceUnavailableError,
)
from durable_spaces.host.bounded import load_object
from durable_spaces.host.ports import free_port
from durable_spaces.settings import Settings

__all__ = ["MicrovmBackend", "MicrovmSpace", "unavailable_reason"]


def unavailable_reason(
    image_dir: str | os.PathLike[str] | None = None, settings: Settings | None = None
) -> str | None:
    """None when microvm Spaces can run here; otherwise why not (for a test skip).
    ``settings``: read from the environment when not given (the registry's call)."""
    for tool in ("qemu-system-x86_64", "qemu-img"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (images/microvm/ci-setup.sh)"
    cache = (Settings.from_env() if settings is None else settings).microvm_cache
    img = load_image(pathlib.Path(image_dir) if image_dir else None, cache)
    if img is None:
        return "the microvm image is not built: run make microvm-image"
    if not any(img.dir.glob("base-*m/done")):
        return "the microvm base checkpoint is missing: run make microvm-image"
    return None


class MicrovmBackend:
    """QEMU microvm guests as Spaces, under ``state_dir``.

    ``image_dir``: a built image (default ``~/.cache/durable-spaces-microvm/current``);
    ``memory_mb``: guest memory (a base checkpoint must exist for it);
    ``keep_checkpoints``: keep only this many newest checkpoints per Space, plus the one
    the Space was last restored from (``Settings.microvm_keep_checkpoints``, default 0: keep
    all until pruned). The adapter prunes by its log (``prune_space``), which is exact: an
    age bound could drop a checkpoint a fork's log still needs. Set it only when driving
    the backend without the adapter.
    ``compress``: zstd the memory files (``Settings.microvm_compress``, default on): a
    third of the disk, for a longer pause of the guest (docs/performance.md).
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
        settings: Settings | None = None,
    ) -> None:
        """Options left None take ``settings`` (``durable_spaces/settings.py``: the
        ``DS_MICROVM_*`` variables), read from the environment now when not given."""
        #: The product's settings.
        self.settings = settings = Settings.from_env() if settings is None else settings
        if sweep_orphans is None:
            sweep_orphans = settings.microvm_sweep_orphans
        #: Kill processes the daemon does not track when the epoch rises. Off by default:
        #: on a machine-checkpointed Space a process left running (a server) is state that
        #: checkpoints keep and restores bring back, and a restore replaces the whole
        #: machine, so no stray writer outlives it. On for transactional use, where a
        #: stray writer from an older epoch could change the workspace after a revert.
        self.sweep_orphans = sweep_orphans
        if compress is None:
            compress = settings.microvm_compress
        #: zstd the memory files (about a quarter of the size, a longer pause).
        self.compress = compress
        if keep_checkpoints is None:
            keep_checkpoints = settings.microvm_keep_checkpoints
        self.keep_checkpoints = keep_checkpoints
        reason = unavailable_reason(image_dir, settings)
        if reason is not None:
            raise BackendUnavailableError(reason)
        img = load_image(pathlib.Path(image_dir) if image_dir else None, settings.microvm_cache)
        assert img is not None
        self.image: GuestImage = img
        self.memory_mb = memory_mb
        base = img.base_checkpoint(memory_mb)
        if base is None:
            raise BackendUnavailableError(
                f"no base checkpoint for {memory_mb} MiB in {img.dir}: "
                f"DS_MICROVM_MEMORY_MB={memory_mb} make microvm-image"
            )
        self._base = Source(base[0], [str(base[1])], img.token_file)
        self.state_dir = pathlib.Path(state_dir).absolute()
        self.files = StateFiles(self.state_dir)
        self.store = CheckpointFiles(self.files)
        self.accel = choose_accel(img, settings.microvm_accel)
        spec = load_object(img.base_dir(memory_mb) / "spec.json")
        if spec.get("accel") != self.accel.name:
            raise BackendUnavailableError(
                f"the base checkpoint was made under {spec.get('accel')}, "
                f"guests here run under {self.accel.name}: rebuild it"
            )
        self.spec = qemu.VmSpec(img, memory_mb, self.accel)
        #: Figures of the last operations, for benchmarks: seconds.
        self.last: dict[str, float] = {}
        self.machines = Machines(self, self.spec, self.last)

    def sdk_home(self) -> str:
        home = self.state_dir / ".cua-sdk"
        home.mkdir(mode=0o700, exist_ok=True)
        return str(home)

    def _qmp_sock(self, name: str) -> pathlib.Path:
        return self.files.qmp_sock(name)

    def _ckpt_dir(self, checkpoint_id: str) -> pathlib.Path:
        return checkpoint_dir(self.state_dir, checkpoint_id)

    # --- SpaceBackend -------------------------------------------------------------------------

    async def create(self, name: str) -> MicrovmSpace:
        async with self.files.lock(name):
            st = self.files.read(name)
            if st is not None:
                return await self.machines.ensure_running(name, st)
            return await self.machines.fork_into(name, self._base)

    async def find(self, name: str) -> MicrovmSpace | None:
        async with self.files.lock(name):
            st = self.files.read(name)
            if st is None:
                return None
            return await self.machines.ensure_running(name, st)

    async def delete(self, name: str) -> None:
        async with self.files.lock(name):
            st = self.files.read(name)
            if st is not None:
                qemu.kill(st.pid, st.pid_start)
            self.machines.drop(name)
            shutil.rmtree(self.files.home(name), ignore_errors=True)
            self.files.qmp_sock(name).unlink(missing_ok=True)
        await self.store.gc()

    async def names(self) -> list[str]:
        return self.files.names()

    async def close(self) -> None:
        for sp in list(self.machines.spaces.values()):
            with contextlib.suppress(Exception):
                await sp.close()
        self.machines.spaces.clear()

    # --- Faults ---------------------------------------------------------------------------

    async def restart(self, name: str) -> None:
        async with self.files.lock(name):
            st = self.files.read(name)
            if st is None:
                raise SpaceError(f"no Space {name!r} to restart")
            if qemu.alive(st.pid, st.pid_start):
                # Files written by commands may sit in the guest's page cache: flush them,
                # as a clean reboot would (the ledger itself is fsynced by the daemon).
                sp = self.machines.space(name, st)
                with contextlib.suppress(Exception):
                    await sp.root_run("sync", timeout=15)
            self.machines.kill(name)
            await self.machines.start(name, st, None)

    async def pause(self, name: str) -> None:
        """Freeze the whole machine (QMP ``stop``): every vCPU halts, the daemon with it."""
        async with self.files.lock(name):
            st = self.files.read(name)
            if st is None:
                raise SpaceGoneError(f"no Space {name!r}")
            if qemu.alive(st.pid, st.pid_start):
                st.frozen = True  # so a find() meanwhile does not continue it (settle)
                self.files.write(name, st)
                await qemu.qmp_run(self.files.qmp_sock(name), "stop")

    async def resume(self, name: str) -> None:
        async with self.files.lock(name):
            st = self.files.read(name)
            if st is not None and st.frozen:
                st.frozen = False
                self.files.write(name, st)
                if qemu.alive(st.pid, st.pid_start):
                    await qemu.qmp_run(self.files.qmp_sock(name), "cont")

    async def kill_daemon(self, name: str) -> None:
        async with self.files.lock(name):
            st = self.files.read(name)
            if st is None:
                raise SpaceGoneError(f"no Space {name!r}")
            sp = await self.machines.ensure_running(name, st)
            st = self.files.read(name) or st
            code, before = await sp.root_run(f"cat {DAEMON_PID}", timeout=10)
            st.boot = secrets.token_hex(6)
            self.files.write(name, st)  # waiters must see a new daemon from now on
            # Detached, so the kill does not cut its own answer short.
            with contextlib.suppress(SpaceUnavailableError, TimeoutError):
                await sp.root_run(
                    '(sleep 0.05; kill -9 "$1") >/dev/null 2>&1 &',
                    before.strip().decode(),
                    timeout=10,
                )
            sp.disconnect()
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(SpaceUnavailableError, TimeoutError):
                    code, now = await sp.root_run(f"cat {DAEMON_PID}", timeout=10)
                    if code == 0 and now.strip() and now.strip() != before.strip():
                        break
                sp.disconnect()
                if time.monotonic() > deadline:
                    raise SpaceUnavailableError(f"the daemon of {name!r} did not come back")
                await asyncio.sleep(0.05)

    # --- MachineCheckpoints ---------------------------------------------------------------

    def checkpoint_meta(self, checkpoint_id: str) -> CheckpointMeta:
        return self.store.meta(checkpoint_id)

    async def checkpoints(self) -> list[str]:
        return self.store.ids()

    async def checkpoint(self, name: str, epoch: int | None = None) -> str:
        """Checkpoint the whole machine (memory and disk) of Space ``name``; returns the id.
        The guest pauses for the memory copy only (a fraction of a second). ``epoch``
        fences it (a stale driver's checkpoint is refused)."""
        async with self.files.lock(name):
            st = self.files.raise_floor(name, None, epoch)
            if not qemu.alive(st.pid, st.pid_start):
                raise SpaceUnavailableError(f"the machine of Space {name!r} is not running")
            cid = secrets.token_hex(12)
            d = self.store.dir(cid)
            part = d.with_name(d.name + ".part")
            part.mkdir(mode=0o700)
            new_top = self.state_dir / "disks" / f"{uuid.uuid4().hex}.qcow2"
            async with self.files.lock("pool"):
                mem = part / ("memory.zst" if self.compress else "memory")
                figs = await qemu.save_checkpoint(self.files.qmp_sock(name), mem, new_top)
                frozen = list(st.chain)
                st.chain = [*frozen, str(new_top)]
                self.files.write(name, st)
            with contextlib.suppress(OSError):
                pathlib.Path(frozen[-1]).chmod(0o400)  # never written again
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
            self.store.write(part, self.files.token(name), meta)
            self.last["checkpoint_pause"] = figs.pause_s
            self.last["checkpoint_bytes"] = float(figs.memory_bytes)
        await self.store.retain(name, self.keep_checkpoints)
        return cid

    def _source(self, checkpoint_id: str) -> Source:
        return self.store.source(
            checkpoint_id, self.memory_mb, self.accel.name, str(self.image.dir)
        )

    async def restore(
        self, name: str, checkpoint_id: str, epoch: int | None = None
    ) -> MicrovmSpace:
        """Replace Space ``name`` with a fork of the checkpoint (same name, instance and
        token). Its processes come back as they were.

        Fenced by ``epoch`` against the host floor (a stale driver's restore is refused
        and changes nothing). The restored guest comes back on a new port and has its
        floor raised to the host's before the lock is released: the checkpoint's older
        floor is never reachable, even by a stale client that kept a connection.

        A Space that no longer exists (removed, lost) is placed again from the checkpoint:
        a new instance (new id and token) with the checkpoint's machine in it."""
        source = self._source(checkpoint_id)
        async with self.files.lock(name):
            st = self.files.read(name)
            if st is None:
                sp = await self.machines.fork_into(name, source, checkpoint_id)
                if epoch is not None:
                    self.files.raise_floor(name, None, epoch)
                    await sp.advance_guest(epoch)
                await self.store.gc()
                return sp
            st = self.files.raise_floor(name, None, epoch)
            self.machines.kill(name)
            async with self.files.lock("pool"):
                st.chain = [*source.chain, self.machines.new_layer(source.chain[-1])]
                st.restored_from = checkpoint_id
                st.port = free_port()
                self.files.write(name, st)
            st = await self.machines.start(name, st, source)
            sp = self.machines.space(name, st)
            if st.floor:
                await sp.advance_guest(st.floor)
        await self.store.gc()
        return sp

    async def fork(self, checkpoint_id: str, new_name: str) -> MicrovmSpace:
        """A new Space ``new_name`` running from the checkpoint (its own token, port and
        instance); the checkpoint's Space is untouched."""
        source = self._source(checkpoint_id)
        async with self.files.lock(new_name):
            if self.files.read(new_name) is not None:
                raise SpaceError(f"a Space {new_name!r} already exists")
            return await self.machines.fork_into(new_name, source, checkpoint_id)

    async def prune(self, keep: set[str]) -> list[str]:
        """Delete every checkpoint not in ``keep`` and the disk layers nothing refers to;
        returns the ids removed."""
        return await self.store.prune(keep, space=None)

    async def prune_space(self, name: str, keep: set[str]) -> list[str]:
        """Delete Space ``name``'s checkpoints not in ``keep`` (the ones no recorded
        checkpoint refers to), except one a living Space was restored or forked from;
        returns the ids removed. Other Spaces' checkpoints are not touched."""
        return await self.store.prune(keep, space=name)

    # --- helpers for tests and benchmarks ---------------------------------------------------

    def qemu_pid(self, name: str) -> int | None:
        st = self.files.read(name)
        return st.pid if st is not None and qemu.alive(st.pid, st.pid_start) else None

    def env_for(self, name: str) -> Mapping[str, str]:
        st = self.files.read(name)
        return {"port": str(st.port)} if st else {}

    def layers(self, name: str) -> Sequence[str]:
        st = self.files.read(name)
        return list(st.chain) if st else []


if TYPE_CHECKING:  # what mypy checks this backend against (durable_spaces.space)
    from durable_spaces.backends.microvm.microvm_space import MicrovmHost
    from durable_spaces.space import Faults, MachineCheckpoints, Space, SpaceBackend

    def _conforms(
        b: MicrovmBackend, s: MicrovmSpace
    ) -> tuple[SpaceBackend, Faults, MachineCheckpoints, MicrovmHost, Space]:
        return b, b, b, b, s
