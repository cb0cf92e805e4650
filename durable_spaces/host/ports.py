"""A free TCP port of this host. No dependencies, so a backend, the cluster and the lab
all import it."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the kernel's pick; another process may take it before
    the caller binds it, which every caller handles by binding again)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
