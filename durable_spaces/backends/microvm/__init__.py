"""Backend ``microvm``: QEMU guests running cua-spacesd, with whole-machine checkpoints.
``backend`` (the backend: Spaces, faults, checkpoints, restores, forks), ``state`` (each
Space's record, lock and host floor), ``machines`` (starting and stopping machines),
``checkpoints`` (checkpoint files and the disk pool), ``microvm_space`` (the client side),
``qemu`` (the QEMU process and QMP), ``accel`` (KVM or TCG), ``guest`` (the built image
as run), ``image`` and ``base`` (building the guest and its booted base checkpoint)."""

from durable_spaces.backends.microvm.backend import MicrovmBackend, unavailable_reason

__all__ = ["MicrovmBackend", "unavailable_reason"]
