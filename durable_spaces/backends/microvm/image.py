"""The microvm guest image, built offline from Debian packages, and its booted base checkpoint.

Nothing can be downloaded here except from Debian's mirror and PyPI, so the guest is made
of: the Debian *cloud* kernel (``apt-get download linux-image-<abi>-cloud-amd64``: small,
with the virtio drivers as modules), an initramfs of busybox-static plus those modules (it
loads them, mounts ``/dev/vda`` and switch_roots), and the shared guest root filesystem
(``guest_rootfs``: debootstrap minbase, the ``cua`` user) with the static cua-spacesd
from the installed ``cua`` wheel and a bash pid 1 (``/sbin/cua-init``) that supervises
the daemon. ``mkfs.ext4 -d`` turns the tree into a raw image which becomes the qcow2 base.

Everything lands in ``~/.cache/durable-spaces-microvm/<hash>/`` (``DS_MICROVM_CACHE``; kept
apart from ``~/.cache/durable-spaces``, which other builders clear to time cold builds)
where the hash covers the recipe (``recipe()``: the guest scripts and settings, and the
shared root filesystem's), the kernel package, busybox, the daemon's sha256 and the QEMU
version, so a rebuild happens only when an input changed; ``current`` beside it points at
the newest build (``guest`` reads it). The debootstrap tarball is shared with the docker
image in ``~/.cache/durable-spaces`` (``DS_CACHE_DIR``).

Then the image is booted once and checkpointed (``base``): creating a Space is a fork of
that booted machine.

Entry point: ``python -m durable_spaces.backends.microvm.image`` (``make microvm-image``).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

from durable_spaces.backends import guest_rootfs
from durable_spaces.backends.guest_rootfs import daemon_binary, file_sha256, input_hash
from durable_spaces.backends.microvm.base import ensure_base_checkpoint
from durable_spaces.backends.microvm.guest import (
    GUEST_PORT,
    KERNEL_CMDLINE,
    GuestImage,
    image_root,
    load_image,
)
from durable_spaces.backends.microvm.guest import log as _log
from durable_spaces.settings import Settings

KERNEL_META = "linux-image-cloud-amd64"
#: Virtio modules the initramfs loads (their dependencies are resolved from the .ko files).
MODULES = ("virtio_mmio", "virtio_blk", "virtio_net", "virtio-rng", "qemu_fw_cfg")
DISK_SIZE = "4G"
#: What this image adds to the shared tree.
_DIRS = ("run", "tmp")

# The initramfs's /init: load the virtio modules, mount the root disk, hand over.
INITRAMFS_INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /newroot /usr/bin /usr/sbin /sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.load); do insmod /modules/$m 2>/dev/null || echo "insmod $m failed"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 200 ]; do sleep 0.02; i=$((i+1)); done
mount -t ext4 -o rw,noatime /dev/vda /newroot || { echo "no root disk"; poweroff -f; }
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/cua-init
"""

# The guest's pid 1. It mounts the pseudo filesystems, configures user networking, takes
# the token from fw_cfg (root-only in the guest; the kernel command line would show it to
# every user), and runs the daemon as a child it restarts: killing that child is how a
# daemon crash is injected, while pid 1 (and so the machine) stays up. Bash as pid 1 also
# reaps orphans of backgrounded commands.
GUEST_INIT = r"""#!/bin/bash
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
hostname cua-space
BB=/usr/local/bin/busybox
$BB ip link set lo up
$BB ip addr add 10.0.2.15/24 dev eth0
$BB ip link set eth0 up
$BB ip route add default via 10.0.2.2
mkdir -p /run/cua && chmod 700 /run/cua
# The change journal (spacesd/guest_journal.pl) watches every file and directory of the
# workspace as the Space's user: the kernel's default of 8192 watches a user would cut
# it to full scans at a few thousand files.
echo 65536 > /proc/sys/fs/inotify/max_user_watches
FW=/sys/firmware/qemu_fw_cfg/by_name/opt/cua/token/raw
(umask 077; [ -r $FW ] && cat $FW > /run/cua/env-token.new \
  && mv /run/cua/env-token.new /run/cua/env-token)
[ -s /run/cua/env-token ] || echo "cua-init: no token in fw_cfg" > /dev/console
echo "cua-init: starting cua-spacesd" > /dev/console
trap '' TERM INT HUP
while :; do
  CUA_ENV_NO_TELEMETRY=1 DO_NOT_TRACK=1 CUA_TELEMETRY=0 \
  /usr/local/bin/cua-spacesd serve --listen 0.0.0.0:3211 --data-dir /var/lib/cua-spacesd \
    --no-desktop --no-driver --no-mcp --quic-port 0 --no-access-log \
    --await-token-file --token-file /run/cua/env-token </dev/null >>/run/cua/daemon.log 2>&1 &
  echo $! > /run/cua/daemon.pid
  wait $!
  echo "cua-init: cua-spacesd exited ($?), restarting" > /dev/console
  sleep 0.2
done
"""


def qemu_version() -> str:
    out = subprocess.run(
        ["qemu-system-x86_64", "--version"], capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()[0]


def busybox_static() -> pathlib.Path:
    """Debian's busybox-static installs a static /bin/busybox."""
    p = pathlib.Path("/bin/busybox")
    if not p.exists():
        raise SystemExit("busybox-static is not installed (apt-get install -y busybox-static)")
    info = subprocess.run(["file", "-L", str(p)], capture_output=True, text=True).stdout
    if info and "static" not in info:
        raise SystemExit("/bin/busybox is not static: apt-get install -y busybox-static")
    return p


def kernel_package() -> str:
    """The ABI package the cloud kernel metapackage depends on right now."""
    out = subprocess.run(
        ["apt-cache", "depends", KERNEL_META], capture_output=True, text=True, check=True
    ).stdout
    m = re.search(r"Depends: (linux-image-\S+-cloud-amd64)", out)
    if not m:
        raise SystemExit(f"cannot resolve {KERNEL_META} (apt-get update?)")
    return m.group(1)


def kernel_deb(settings: Settings) -> pathlib.Path:
    """The kernel .deb: ``Settings.microvm_kernel_deb``, apt's archive cache, our cache,
    or ``apt-get download`` from the Debian mirror."""
    if settings.microvm_kernel_deb is not None:
        return settings.microvm_kernel_deb
    pkg = kernel_package()
    debs = image_root(settings.microvm_cache) / "debs"
    for d in (debs, pathlib.Path("/var/cache/apt/archives")):
        hits = sorted(d.glob(f"{pkg}_*_amd64.deb"))
        if hits:
            return hits[-1]
    debs.mkdir(parents=True, exist_ok=True)
    _log(f"apt-get download {pkg}")
    subprocess.run(["apt-get", "download", pkg], cwd=debs, check=True, capture_output=True)
    hits = sorted(debs.glob(f"{pkg}_*_amd64.deb"))
    if not hits:
        raise SystemExit(f"apt-get download {pkg} produced no .deb")
    return hits[-1]


#: Bump when the build steps below change in a way the hashed recipe does not show.
RECIPE_VERSION = 1


def recipe() -> str:
    """Everything of this module that ends up in the image (not its comments or docs)."""
    return json.dumps(
        [
            RECIPE_VERSION,
            INITRAMFS_INIT,
            GUEST_INIT,
            KERNEL_CMDLINE,
            MODULES,
            DISK_SIZE,
            _DIRS,
            GUEST_PORT,
            guest_rootfs.recipe(),
        ]
    )


def image_key(kdeb: pathlib.Path, settings: Settings) -> str:
    return input_hash(
        recipe(),
        kdeb.name,
        file_sha256(busybox_static()),
        file_sha256(daemon_binary()),
        qemu_version(),
        guest_rootfs.debootstrap_key(settings),
    )


def _module_deps(ko: pathlib.Path) -> list[str]:
    """The ``depends=`` field of a module's .modinfo (no depmod/kmod on the host)."""
    m = re.search(rb"depends=([^\x00]*)\x00", ko.read_bytes())
    return [d for d in (m.group(1).decode().split(",") if m else []) if d]


def _build_initramfs(kroot: pathlib.Path, out: pathlib.Path) -> None:
    mods = {p.stem.replace("-", "_"): p for p in kroot.glob("lib/modules/*/kernel/**/*.ko")}
    order: list[str] = []

    def visit(name: str) -> None:
        name = name.replace("-", "_")
        if name in order:
            return
        if name not in mods:
            raise SystemExit(f"kernel module {name} not in the kernel package")
        for dep in _module_deps(mods[name]):
            visit(dep)
        order.append(name)

    for m in MODULES:
        visit(m)
    with tempfile.TemporaryDirectory(prefix="ds-initramfs-") as tmp:
        root = pathlib.Path(tmp)
        (root / "bin").mkdir()
        (root / "modules").mkdir()
        shutil.copy2(busybox_static(), root / "bin/busybox")
        for name in order:
            shutil.copy2(mods[name], root / "modules" / mods[name].name)
        (root / "modules.load").write_text("\n".join(mods[n].name for n in order) + "\n")
        init = root / "init"
        init.write_text(INITRAMFS_INIT)
        init.chmod(0o755)
        files = subprocess.run(["find", "."], cwd=root, capture_output=True, check=True).stdout
        cpio = subprocess.run(
            ["/bin/busybox", "cpio", "-o", "-H", "newc", "-R", "0:0"],
            cwd=root,
            input=files,
            capture_output=True,
            check=True,
        ).stdout
        out.write_bytes(
            subprocess.run(["gzip", "-9"], input=cpio, capture_output=True, check=True).stdout
        )
    _log(f"initramfs modules: {' '.join(order)}")


def _build_rootfs(tarball: pathlib.Path, out_qcow2: pathlib.Path, tmpdir: pathlib.Path) -> None:
    root = tmpdir / "rootfs"
    root.mkdir()
    guest_rootfs.prepare_rootfs(tarball, root, _DIRS)
    bindir = root / "usr/local/bin"
    bindir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(daemon_binary(), bindir / "cua-spacesd")
    shutil.copy2(busybox_static(), bindir / "busybox")
    for b in ("cua-spacesd", "busybox"):
        (bindir / b).chmod(0o755)
    init = root / "sbin/cua-init"
    init.write_text(GUEST_INIT)
    init.chmod(0o755)
    (root / "etc/hostname").write_text("cua-space\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost cua-space\n")
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    (root / "etc/resolv.conf").write_text("nameserver 10.0.2.3\n")
    (root / "etc/fstab").write_text("/dev/vda / ext4 rw,noatime 0 1\n")
    raw = tmpdir / "rootfs.raw"
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", "cuaroot", "-d", str(root), str(raw), DISK_SIZE],
        check=True,
    )
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(out_qcow2)], check=True
    )


def build_image(settings: Settings, force: bool = False) -> GuestImage:
    """Build (or reuse) the guest image for the current inputs."""
    for tool in ("qemu-system-x86_64", "qemu-img", "mkfs.ext4", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing (images/microvm/ci-setup.sh installs it)")
    kdeb = kernel_deb(settings)
    key = image_key(kdeb, settings)
    root = image_root(settings.microvm_cache)
    out = root / key
    current = root / "current"
    if not force and (out / "done").exists():
        _log(f"{out} is up to date")
    else:
        t0 = time.monotonic()
        tarball = guest_rootfs.rootfs_tarball(settings, _log)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="ds-microvm-", dir=root) as tmp:
            t = pathlib.Path(tmp)
            kroot = t / "kernel"
            subprocess.run(["dpkg-deb", "-x", str(kdeb), str(kroot)], check=True)
            vmlinuz = next(kroot.glob("boot/vmlinuz-*"))
            shutil.copy2(vmlinuz, out / "vmlinuz")
            _build_initramfs(kroot, out / "initrd.img")
            _build_rootfs(tarball, t / "rootfs.qcow2", t)
            (t / "rootfs.qcow2").replace(out / "rootfs.qcow2")
        (out / "rootfs.qcow2").chmod(0o444)  # a backing file: never written again
        token = out / "token"
        if not token.exists():
            fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        (out / "inputs.json").write_text(
            json.dumps(
                {
                    "kernel_deb": kdeb.name,
                    "daemon_sha256": file_sha256(daemon_binary()),
                    "qemu": qemu_version(),
                    "debootstrap": guest_rootfs.debootstrap_key(settings),
                },
                indent=1,
            )
        )
        (out / "done").write_text(f"{time.time()}\n")
        _log(f"built {out} in {time.monotonic() - t0:.1f}s")
    tmp_link = root / f".current.{os.getpid()}"
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(key)
    tmp_link.replace(current)
    img = load_image(out)
    assert img is not None
    return img


def main() -> None:
    t0 = time.monotonic()
    settings = Settings.from_env()  # this command's edge: the DS_* variables, checked
    img = build_image(settings, force="--force" in sys.argv[1:])
    asyncio.run(ensure_base_checkpoint(img, settings.microvm_memory_mb, settings))
    print(img.dir)
    _log(f"total {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    main()
