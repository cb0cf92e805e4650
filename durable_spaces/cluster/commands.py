"""What ``durable-spaces host / coordinator`` do, kept beside the cluster code so
``durable_spaces/cli/cluster.py`` only parses options (and imports this only when used).
``durable-spaces tls ...`` is ``enrol.py``; the lab's commands (``submit``, ``worker``) are
in ``campaigns/cluster/commands.py``."""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Sequence
from pathlib import Path

from durable_spaces.cluster.drive import ClusterCoordinator, DriveSettings, SharedDirectory
from durable_spaces.cluster.host import HostAgent
from durable_spaces.errors import ConfigError


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")


def backoff_triple(text: str) -> tuple[float, float, float]:
    """``initial,max,factor`` as three positive numbers."""
    try:
        a, b, c = (float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"backoff {text!r}: use initial,max,factor (e.g. 2,60,2)") from None
    if min(a, b, c) <= 0:
        raise ConfigError(f"backoff {text!r}: every number must be positive")
    return a, b, c


def run_host(
    db: str,
    host_id: str,
    address: str,
    backend: str,
    state_dir: Path,
    *,
    tls_dir: Path | None,
    listen_host: str | None,
    heartbeat_secs: float,
    sweep_secs: float,
) -> None:
    _logging()
    agent = HostAgent(
        db,
        host_id,
        address,
        backend,
        state_dir,
        tls_dir=tls_dir,
        listen_host=listen_host,
        heartbeat_secs=heartbeat_secs,
        sweep_secs=sweep_secs,
    )
    asyncio.run(agent.run())


def run_coordinator(
    db: str, coordinator_id: str, sessions_dir: Path, settings: DriveSettings
) -> None:
    _logging()

    async def main() -> None:
        import signal

        c = ClusterCoordinator(db, coordinator_id, SharedDirectory(sessions_dir), settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, c.stopping.set)
        await c.run()

    asyncio.run(main())


def driver_argv(text: str | None) -> Sequence[str] | None:
    if text is None:
        return None
    argv = shlex.split(text)
    if not argv:
        raise ConfigError("--driver is empty")
    return argv
