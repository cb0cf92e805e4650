"""Backend ``microvm``: QEMU guests running cua-spacesd, with whole-machine checkpoints.
``backend`` (Spaces, checkpoints, restores, forks), ``qemu`` (the QEMU mechanics),
``image`` (the guest: kernel, initramfs, rootfs, booted base checkpoint)."""

from durable_spaces.backends.microvm.backend import MicrovmBackend, unavailable_reason

__all__ = ["MicrovmBackend", "unavailable_reason"]
