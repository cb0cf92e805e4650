"""The microvm guest as the backend sees it at run time: where a built image lives, what it
holds, and the few facts of it the host relies on (the daemon's port, the workspace, the
kernel command line). Building it is ``image``'s part; this module only reads.

Images live in ``~/.cache/durable-spaces-microvm/<hash>/`` (``DS_MICROVM_CACHE``), with
``current`` beside them pointing at the newest build.
"""

from __future__ import annotations

import os
import pathlib
import sys
from dataclasses import dataclass

from durable_spaces.backends.guest_rootfs import WORKSPACE

__all__ = [
    "DEFAULT_MEMORY_MB",
    "GUEST_PORT",
    "KERNEL_CMDLINE",
    "WORKSPACE",
    "GuestImage",
    "image_root",
    "load_image",
    "log",
]

#: Where cua-spacesd listens inside the guest (forwarded to a loopback port of the host).
GUEST_PORT = 3211
DEFAULT_MEMORY_MB = 512

KERNEL_CMDLINE = (
    "console=ttyS0 root=/dev/vda rw quiet loglevel=3 panic=-1 "
    "random.trust_cpu=on tsc=reliable i8042.noaux i8042.nokbd"
)


@dataclass(frozen=True)
class GuestImage:
    """What a Space boots: kernel, initramfs, qcow2 base, and the booted base checkpoint."""

    dir: pathlib.Path
    kernel: pathlib.Path
    initrd: pathlib.Path
    rootfs: pathlib.Path
    token_file: pathlib.Path

    def base_dir(self, memory_mb: int) -> pathlib.Path:
        return self.dir / f"base-{memory_mb}m"

    def base_checkpoint(self, memory_mb: int) -> tuple[pathlib.Path, pathlib.Path] | None:
        """(memory file, frozen disk) of the booted base, or None when not made yet."""
        d = self.base_dir(memory_mb)
        mem, disk = d / "memory", d / "disk.qcow2"
        if (d / "done").exists() and mem.exists() and disk.exists():
            return mem, disk
        return None


def log(msg: str) -> None:
    """A line of the image's build (``make microvm-image``) on stderr."""
    print(f"[microvm-image] {msg}", file=sys.stderr, flush=True)


def _user_home() -> pathlib.Path:
    """The user's real home: tests point ``HOME`` at a temporary directory, and a Space
    must still find the image built by ``make microvm-image``."""
    import pwd

    return pathlib.Path(pwd.getpwuid(os.getuid()).pw_dir)


def image_root(cache: pathlib.Path | None = None) -> pathlib.Path:
    """Where images are: ``cache`` (``Settings.microvm_cache``), else the user's cache."""
    d = cache if cache is not None else _user_home() / ".cache/durable-spaces-microvm"
    d.mkdir(parents=True, exist_ok=True)
    return d


def load_image(
    image_dir: pathlib.Path | None = None, cache: pathlib.Path | None = None
) -> GuestImage | None:
    """The built image in ``image_dir`` (default: ``<image_root(cache)>/current``), or None."""
    d = image_dir or image_root(cache) / "current"
    if not (d / "done").exists():
        return None
    d = d.resolve()
    return GuestImage(
        dir=d,
        kernel=d / "vmlinuz",
        initrd=d / "initrd.img",
        rootfs=d / "rootfs.qcow2",
        token_file=d / "token",
    )
