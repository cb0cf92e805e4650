"""The booted base checkpoint of a microvm image: what every Space forks.

Creating a Space is a fork of a machine that has already booted (about half a second)
instead of a cold boot (about six seconds or more under TCG). So ``make microvm-image``
boots the image once per memory size and checkpoints it into ``base-<mem>m/`` of the
image directory: memory, frozen disk, and ``spec.json`` (memory size, accelerator,
kernel command line), which a backend checks against its own before forking.
Forks start with the image's token (``token``, 0600, in the image dir); the backend
rotates it to a per-Space token at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time

from durable_spaces.backends.microvm.accel import choose_accel
from durable_spaces.backends.microvm.guest import DEFAULT_MEMORY_MB, GuestImage, log
from durable_spaces.backends.microvm.qemu import (
    VmSpec,
    create_overlay,
    kill,
    launch,
    qemu_argv,
    save_checkpoint,
    wait_health,
)
from durable_spaces.host.ports import free_port
from durable_spaces.settings import DEFAULTS, Settings


async def ensure_base_checkpoint(
    img: GuestImage, memory_mb: int = DEFAULT_MEMORY_MB, settings: Settings = DEFAULTS
) -> None:
    """Boot the image once and checkpoint the booted machine (what every Space forks)."""
    choose_accel(
        img, settings.microvm_accel
    )  # probed (and cached) here, not in the first Space's create
    if img.base_checkpoint(memory_mb) is not None:
        log(f"base checkpoint for {memory_mb} MiB is up to date")
        return
    t0 = time.monotonic()
    await make_base_checkpoint(img, memory_mb, settings)
    log(f"booted and checkpointed the base ({memory_mb} MiB) in {time.monotonic() - t0:.1f}s")


async def make_base_checkpoint(
    img: GuestImage, memory_mb: int, settings: Settings = DEFAULTS
) -> None:
    """Boot the image once, wait for the daemon, and checkpoint the machine into
    ``img.base_dir(memory_mb)`` (memory + frozen disk), for Spaces to fork."""
    accel = choose_accel(img, settings.microvm_accel)
    spec = VmSpec(img, memory_mb, accel)
    final = img.base_dir(memory_mb)
    work = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    disk = work / "disk.qcow2"
    create_overlay(disk, img.rootfs)
    port = free_port()
    argv = qemu_argv(spec, disk=disk, port=port, token_file=img.token_file, run_dir=work)
    t0 = time.monotonic()
    vm = launch(argv, work)
    try:
        booted = await wait_health(port, settings.microvm_boot_timeout, vm, work)
        log(f"base booted to the daemon's first answer in {booted:.1f}s ({accel.name})")
        # Let the guest settle (daemon start-up writes) so forks start quiet.
        await asyncio.sleep(1.0)
        figs = await save_checkpoint(
            work / "qmp.sock", work / "memory", work / "scratch.qcow2", resume=False
        )
        log(
            f"base checkpoint: pause {figs.pause_s:.2f}s, memory "
            f"{figs.memory_bytes / 1e6:.0f} MB, total {time.monotonic() - t0:.1f}s"
        )
    finally:
        kill(vm.pid, vm.start)
    (work / "scratch.qcow2").unlink(missing_ok=True)
    for f in ("qmp.sock",):
        (work / f).unlink(missing_ok=True)
    disk.chmod(0o400)
    (work / "spec.json").write_text(
        json.dumps({"memory_mb": memory_mb, "accel": accel.name, "cmdline": spec.cmdline()})
    )
    (work / "done").write_text(f"{time.time()}\n")
    # The frozen disk is referenced by absolute path from every fork's overlay, so the
    # directory is renamed only now, before any overlay exists.
    if final.exists():
        shutil.rmtree(work, ignore_errors=True)
        return
    # qcow2 overlays made later point at final/disk.qcow2; nothing points at work/ yet
    # except scratch (deleted), so a rename is safe.
    work.rename(final)
