"""Which accelerator a microvm guest runs under: KVM only when it really boots this kernel.

``/dev/kvm`` on these machines is PVM, a software hypervisor on which a stock kernel
hangs early, so a *boot test* decides (a throwaway guest must reach its daemon under
KVM), not the presence of the device; otherwise TCG, with the reason logged. The answer
depends on the host, QEMU and the guest kernel only, so it is cached beside the images
(``accel.json``) under that key and probed once per machine, at image build time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pathlib
import tempfile

from durable_spaces.backends.microvm.guest import GuestImage, log
from durable_spaces.backends.microvm.qemu import (
    Accel,
    VmSpec,
    create_overlay,
    kill,
    launch,
    log_tail,
    qemu_argv,
    wait_health,
)
from durable_spaces.errors import SpaceUnavailableError
from durable_spaces.host.bounded import load_object
from durable_spaces.host.ports import free_port

logger = logging.getLogger(__name__)

#: A KVM that works boots this guest in a second or two; PVM hangs silently.
KVM_PROBE_TIMEOUT = 20.0

_accel: Accel | None = None


def choose_accel(img: GuestImage, forced: str | None = None) -> Accel:
    """KVM when a real boot reaches the daemon under it, else TCG; cached in the image dir.
    ``forced`` (``Settings.microvm_accel``: ``DS_MICROVM_ACCEL=tcg|kvm``) forces one."""
    global _accel
    if forced in ("tcg", "kvm"):
        return Accel(forced, "forced by DS_MICROVM_ACCEL")
    if _accel is not None:
        return _accel
    # The answer depends on the host, QEMU and the guest kernel, not on the rest of the image.
    key = ""
    with contextlib.suppress(OSError, ValueError, KeyError):
        inputs = load_object(img.dir / "inputs.json")
        key = f"{inputs['qemu']}|{inputs['kernel_deb']}|{os.uname().release}"
    cache = img.dir.parent / "accel.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        d = load_object(cache)
        if d["key"] == key:
            _accel = Accel(d["name"], d["reason"])
            return _accel
    acc = _probe_accel(img)
    tmp = cache.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "name": acc.name, "reason": acc.reason}))
    tmp.replace(cache)
    _accel = acc
    return acc


def _probe_accel(img: GuestImage) -> Accel:
    kvm = pathlib.Path("/dev/kvm")
    if not kvm.exists():
        acc = Accel("tcg", "no /dev/kvm")
    elif not os.access(kvm, os.R_OK | os.W_OK):
        acc = Accel("tcg", "/dev/kvm is not accessible")
    else:
        acc = asyncio.run(_kvm_boot_test(img)) if not _in_loop() else _kvm_boot_thread(img)
    if acc.name == "tcg":
        logger.warning("microvm: running guests under TCG (slow): %s", acc.reason)
        log(f"accelerator: TCG ({acc.reason})")
    else:
        log("accelerator: KVM (a test boot reached the daemon)")
    return acc


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def _kvm_boot_thread(img: GuestImage) -> Accel:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(lambda: asyncio.run(_kvm_boot_test(img))).result()


async def _kvm_boot_test(img: GuestImage) -> Accel:
    spec = VmSpec(img, 256, Accel("kvm", "probe"))
    with tempfile.TemporaryDirectory(prefix="ds-kvm-probe-") as tmp:
        run = pathlib.Path(tmp)
        disk = run / "disk.qcow2"
        create_overlay(disk, img.rootfs)
        port = free_port()
        vm = launch(
            qemu_argv(spec, disk=disk, port=port, token_file=img.token_file, run_dir=run), run
        )
        try:
            await wait_health(port, KVM_PROBE_TIMEOUT, vm, run)
            return Accel("kvm", "a test boot under KVM reached the daemon")
        except SpaceUnavailableError as e:
            logs = log_tail(run, 200).replace("\n", " ")
            said = (
                logs
                if logs.replace("qemu.log:", "").replace("console.log:", "").strip(" |")
                else "nothing on the serial console"
            )
            what = (
                "QEMU exited" if "exited" in str(e) else f"no answer in {KVM_PROBE_TIMEOUT:.0f} s"
            )
            return Accel("tcg", f"a test boot under KVM did not reach the daemon ({what}; {said})")
        finally:
            kill(vm.pid, vm.start)
