"""One QEMU microvm guest: its command line, its process, QMP, and whole-machine checkpoints.

The recipe is the one that worked on these machines (shared/cua-spacesd.md, "microVM
Spaces"): machine ``microvm`` with ACPI (so the kernel finds the virtio-mmio devices),
virtio-blk on a qcow2 overlay, user networking with the daemon's port forwarded to
``127.0.0.1`` only, the token passed through fw_cfg, QMP on a unix socket.

The accelerator is ``accel``'s choice: KVM (``-cpu host``) or TCG (``thread=multi``,
``-cpu max``). Under TCG the kernel cannot calibrate the TSC against the PIT (the
emulated PIT is too jittery under load), so it is told the host's TSC frequency
(``tsc_early_khz``; under TCG the guest TSC is the host's).

Checkpoint (``save_checkpoint``): ``stop`` (drains disk I/O), ``blockdev-snapshot-sync``
freezes the current top layer and continues on a new one, ``migrate`` to
``exec:cat > FILE`` (QEMU 7.2 has no ``file:`` target; ``zstd`` instead of ``cat`` for a
``.zst`` file) writes the memory, ``cont``. The frozen layer and the memory file describe
the same instant. A restore or a fork is the same command line on a new overlay over the
frozen layer plus ``-incoming "exec:cat FILE"``; the machine comes up paused (it was
stopped when saved) and is continued. Both need the same QEMU binary, machine, devices
and memory size, which is why the image hash covers the QEMU version, base checkpoints
are kept per memory size and record their accelerator, and checkpoints record all three.

QEMU is started detached (its own session, stdin closed) so a driver that dies does not
take the machine with it; pid and start time are returned so another process can find
and kill it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from durable_spaces.backends.microvm.guest import GUEST_PORT, KERNEL_CMDLINE, GuestImage
from durable_spaces.backends.spacesd.machine import wait_http_health
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import SpaceError, SpaceUnavailableError
from durable_spaces.host.proc_start import started

log = logging.getLogger(__name__)

_popens: list[subprocess.Popen[bytes]] = []  # ours to reap


@dataclass(frozen=True)
class Accel:
    """The accelerator a guest runs under, and why it was chosen."""

    name: str  # "kvm" | "tcg"
    reason: str

    def args(self) -> list[str]:
        if self.name == "kvm":
            return ["-accel", "kvm", "-cpu", "host"]
        return ["-accel", "tcg,thread=multi", "-cpu", "max"]


@dataclass
class VmSpec:
    """Everything that must be identical between a checkpoint and its restores."""

    image: GuestImage
    memory_mb: int
    accel: Accel
    extra_cmdline: str = ""
    _tsc: str = field(default="", repr=False)

    def cmdline(self) -> str:
        parts = [KERNEL_CMDLINE]
        if self.accel.name == "tcg":
            khz = host_tsc_khz()
            if khz:
                parts.append(f"tsc_early_khz={khz}")
        if self.extra_cmdline:
            parts.append(self.extra_cmdline)
        return " ".join(parts)


def host_tsc_khz() -> int | None:
    """The host's nominal TSC frequency (constant TSC: the "cpu MHz" of /proc/cpuinfo)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return round(float(line.split(":")[1]) * 1000)
    except (OSError, ValueError):
        pass
    return None


def qemu_argv(
    spec: VmSpec,
    *,
    disk: pathlib.Path,
    port: int,
    token_file: pathlib.Path,
    run_dir: pathlib.Path,
    qmp_sock: pathlib.Path | None = None,
    incoming: pathlib.Path | None = None,
) -> list[str]:
    """The command line; everything but ``disk``, ``port``, the files and ``incoming``
    must be the same for a checkpoint and its restores."""
    img = spec.image
    argv = [
        "qemu-system-x86_64",
        "-M",
        "microvm,x-option-roms=off,rtc=on,isa-serial=on",
        *spec.accel.args(),
        "-m",
        str(spec.memory_mb),
        "-smp",
        "1",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        str(img.kernel),
        "-initrd",
        str(img.initrd),
        "-append",
        spec.cmdline(),
        "-drive",
        f"id=disk0,file={disk},format=qcow2,if=none,cache=writeback,discard=unmap",
        "-device",
        "virtio-blk-device,drive=disk0",
        "-netdev",
        f"user,id=n0,restrict=off,hostfwd=tcp:127.0.0.1:{port}-:{GUEST_PORT}",
        "-device",
        "virtio-net-device,netdev=n0",
        "-device",
        "virtio-rng-device",
        "-fw_cfg",
        f"name=opt/cua/token,file={token_file}",
        "-qmp",
        f"unix:{qmp_sock or run_dir / 'qmp.sock'},server=on,wait=off",
        "-serial",
        f"file:{run_dir / 'console.log'}",
    ]
    if incoming is not None:
        reader = "zstd -dcq" if incoming.suffix == ".zst" else "cat"
        argv += ["-incoming", f"exec:{reader} {shlex.quote(str(incoming))}"]
    return argv


@dataclass
class VmProcess:
    pid: int
    start: float


def launch(
    argv: list[str], run_dir: pathlib.Path, qmp_sock: pathlib.Path | None = None
) -> VmProcess:
    """Start QEMU detached from us; returns once the process exists."""
    reap()
    run_dir.mkdir(parents=True, exist_ok=True)
    (qmp_sock or run_dir / "qmp.sock").unlink(missing_ok=True)
    with open(run_dir / "qemu.log", "ab") as logf:
        p = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _popens.append(p)
    try:
        start = started(p.pid)
    except psutil.NoSuchProcess:
        start = 0.0
    return VmProcess(p.pid, start)


def kill_strays(qmp_sock: pathlib.Path) -> list[int]:
    """SIGKILL every QEMU serving ``qmp_sock`` (unique per Space) and wait until gone.

    A driver killed between starting QEMU and recording its pid leaves a machine nobody
    knows; a second QEMU on the same disk would be refused its write lock (and two
    machines on one ledger would break it), so the next start removes it first."""
    needle = f"unix:{qmp_sock},"
    found: list[tuple[int, float]] = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if cmd and "qemu-system" in cmd[0] and any(needle in c for c in cmd):
            with contextlib.suppress(psutil.NoSuchProcess):
                found.append((proc.pid, started(proc.pid)))
    for pid, start in found:
        log.warning("killing a stray QEMU %d of %s", pid, qmp_sock)
        kill(pid, start)
    return [pid for pid, _ in found]


def reap() -> None:
    _popens[:] = [p for p in _popens if p.poll() is None]


def alive(pid: int, start: float) -> bool:
    if pid <= 0:
        return False
    reap()
    try:
        p = psutil.Process(pid)
        return abs(started(pid) - start) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill(pid: int, start: float, timeout: float = 10.0) -> None:
    """SIGKILL QEMU (the whole machine) and wait until it is gone."""
    if not alive(pid, start):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while alive(pid, start) or _exiting(pid):
        if time.monotonic() > deadline:
            raise SpaceError(f"QEMU {pid} survived SIGKILL")
        time.sleep(0.005)


def _exiting(pid: int) -> bool:
    """A killed multi-threaded QEMU can read as a zombie while its other threads are still
    exiting and holding its files (the disk's write lock): wait for the last thread."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def log_tail(run_dir: pathlib.Path, n: int = 800) -> str:
    out = []
    for f in ("qemu.log", "console.log"):
        with contextlib.suppress(OSError):
            out.append(f"{f}: " + (run_dir / f).read_bytes()[-n:].decode(errors="replace"))
    return " | ".join(out).strip()


async def wait_health(
    port: int, timeout: float, vm: VmProcess | None = None, run_dir: pathlib.Path | None = None
) -> float:
    """Poll the daemon's ``GET /health`` through the forward; seconds waited. User
    networking accepts the host connection even while nothing listens in the guest, so
    only an HTTP answer counts. Gives up at once when QEMU has exited."""

    def qemu_exited() -> str | None:
        if vm is not None and not alive(vm.pid, vm.start):
            tail = log_tail(run_dir) if run_dir else ""
            return f"QEMU exited before the daemon answered: {tail}"
        return None

    return await wait_http_health(port, timeout, interval=0.05, give_up=qemu_exited)


class Qmp:
    """A short-lived QMP connection (one per operation: QEMU serves one client at a time)."""

    def __init__(self, sock: pathlib.Path) -> None:
        self.sock = sock
        self._c: object | None = None

    async def __aenter__(self) -> Qmp:
        from qemu.qmp import QMPClient

        c = QMPClient("ds-microvm")
        deadline = time.monotonic() + 20
        while not self.sock.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # QEMU creates it a moment after it starts
        while True:
            try:
                await c.connect(str(self.sock))
                break
            except Exception as e:  # the socket appears a moment after QEMU starts
                if time.monotonic() > deadline:
                    raise SpaceUnavailableError(f"QMP at {self.sock}: {e}") from None
                await asyncio.sleep(0.02)
        self._c = c
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._c is not None:
            with contextlib.suppress(Exception):
                await self._c.disconnect()  # type: ignore[attr-defined]

    async def run(self, cmd: str, args: dict[str, object] | None = None) -> object:
        assert self._c is not None
        return await self._c.execute(cmd, args)  # type: ignore[attr-defined]

    async def status(self) -> str:
        st = await self.run("query-status")
        return str(st["status"]) if isinstance(st, dict) else "?"


async def resume_incoming(qmp_sock: pathlib.Path, vm: VmProcess, timeout: float) -> float:
    """Wait until QEMU has loaded the incoming memory, then ``cont``; seconds waited.

    The machine was stopped when its memory was saved, and QEMU keeps that run state on
    the destination: it comes up ``paused`` and must be continued."""
    t0 = time.monotonic()
    async with Qmp(qmp_sock) as q:
        while True:
            status = await q.status()
            if status == "paused":
                await q.run("cont")
                return time.monotonic() - t0
            if status == "running":
                return time.monotonic() - t0
            if status not in ("inmigrate", "prelaunch"):
                raise SpaceUnavailableError(f"restore failed: the machine is {status}")
            if not alive(vm.pid, vm.start) or time.monotonic() - t0 > timeout:
                raise SpaceUnavailableError("restore failed: memory was not loaded")
            await asyncio.sleep(0.01)


async def qmp_run(qmp_sock: pathlib.Path, command: str) -> Any:
    """One QMP command (``stop``, ``cont``, ...) on a fresh connection."""
    async with Qmp(qmp_sock) as q:
        return await q.run(command)


async def settle(qmp_sock: pathlib.Path, timeout: float = 60) -> str | None:
    """Bring a machine left half-way by a killed driver back to running; return the file
    its disk writes go to now.

    A driver killed inside ``save_checkpoint`` leaves the guest stopped (maybe with a
    migration in flight, maybe after the disk snapshot switched the top layer); one killed
    inside a restore leaves it loading or paused. Every such machine is continued here."""
    t0 = time.monotonic()
    async with Qmp(qmp_sock) as q:
        while True:
            status = await q.status()
            if status == "running":
                break
            if status == "inmigrate" and time.monotonic() - t0 < timeout:
                await asyncio.sleep(0.02)
                continue
            mig = await q.run("query-migrate")
            if isinstance(mig, dict) and mig.get("status") in ("active", "setup", "device"):
                await q.run("migrate_cancel")
                await asyncio.sleep(0.02)
                continue
            if status in ("paused", "postmigrate", "finish-migrate"):
                await q.run("cont")
                continue
            raise SpaceUnavailableError(f"the machine is {status}")
        blocks = await q.run("query-block")
    for b in blocks if isinstance(blocks, list) else []:
        if b.get("device") == "disk0" and b.get("inserted"):
            return str(b["inserted"]["file"])
    return None


@dataclass(frozen=True)
class CheckpointFigures:
    pause_s: float
    memory_bytes: int


async def save_checkpoint(
    qmp_sock: pathlib.Path, memory: pathlib.Path, new_top: pathlib.Path, *, resume: bool = True
) -> CheckpointFigures:
    """Freeze the machine: memory to ``memory`` (0400 once complete; zstd-compressed when
    its name ends in ``.zst``), the current disk top becomes read-only history and the
    guest continues on ``new_top``."""
    writer = "zstd -1 -q -T1" if memory.suffix == ".zst" else "cat"
    part = memory.with_name(memory.name + ".part")
    part.unlink(missing_ok=True)
    async with Qmp(qmp_sock) as q:
        await q.run("migrate-set-parameters", {"max-bandwidth": 1 << 40})
        t0 = time.monotonic()
        await q.run("stop")
        hit("microvm.checkpoint.stopped")
        try:
            await q.run(
                "blockdev-snapshot-sync",
                {"device": "disk0", "snapshot-file": str(new_top), "format": "qcow2"},
            )
            hit("microvm.checkpoint.snapshot")
            old = os.umask(0o077)
            try:
                await q.run("migrate", {"uri": f"exec:{writer} > {shlex.quote(str(part))}"})
            finally:
                os.umask(old)
            while True:
                info = await q.run("query-migrate")
                status = info.get("status") if isinstance(info, dict) else None
                if status == "completed":
                    break
                if status in ("failed", "cancelled"):
                    raise SpaceError(f"memory checkpoint failed: {info}")
                await asyncio.sleep(0.005)
        finally:
            if resume:
                await q.run("cont")
        pause = time.monotonic() - t0
    # The writer (cat or zstd, a child of QEMU's shell) may still be flushing when QEMU
    # reports completion: wait until no process has the file on its command line.
    await _writers_done(part)
    with open(part, "rb") as f:
        os.fsync(f.fileno())
    part.chmod(0o400)
    part.replace(memory)
    return CheckpointFigures(pause, memory.stat().st_size)


async def _writers_done(path: pathlib.Path, timeout: float = 60) -> None:
    needle = str(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = False
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info.get("cmdline") or []
            if any(needle in c for c in cmd):
                busy = True
                break
        if not busy:
            return
        await asyncio.sleep(0.005)
    raise SpaceError(f"the memory writer for {path} did not finish")


def create_overlay(path: pathlib.Path, backing: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "qemu-img",
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            str(backing),
            "-F",
            "qcow2",
            str(path),
        ],
        check=True,
    )
