"""Backend ``spacesd``: the real cua-spacesd from the ``cua`` wheel as a local process.
``spacesd_space`` is the daemon-backed Space every daemon backend uses (docker and microvm
subclass it), with ``execution`` (following and replaying commands), ``errormap`` (SDK
errors as ours), ``mutate`` (workspace mutations as fenced commands) and ``scan`` (the
incremental scan); ``machine`` is what a backend does around a daemon's machine (health,
orphan sweep); ``daemon`` runs one daemon in its own PID namespace; ``backend`` names
and places them."""

from durable_spaces.backends.spacesd.backend import (
    SpacesdBackend,
    daemon_binary,
    unavailable_reason,
)

__all__ = ["SpacesdBackend", "daemon_binary", "unavailable_reason"]
