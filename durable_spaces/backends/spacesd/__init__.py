"""Backend ``spacesd``: the real cua-spacesd from the ``cua`` wheel as a local process.
``space`` is the daemon-backed Space every daemon backend uses (docker and microvm too);
``daemon`` runs one daemon in its own PID namespace; ``backend`` names and places them."""

from durable_spaces.backends.spacesd.backend import (
    SpacesdBackend,
    daemon_binary,
    unavailable_reason,
)

__all__ = ["SpacesdBackend", "daemon_binary", "unavailable_reason"]
