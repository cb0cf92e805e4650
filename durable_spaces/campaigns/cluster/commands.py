"""What the cluster lab's ``durable-spaces submit / worker`` do (the product's host and
coordinator commands are ``cluster/commands.py``): ``durable_spaces/cli/cluster.py``
only parses options and imports this only when used."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from durable_spaces.campaigns.cluster.submit import agent_config, submit_session
from durable_spaces.cluster.drive import SharedDirectory
from durable_spaces.cluster.store import ClusterStore


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")


def run_submit(
    db: str,
    sessions_dir: Path,
    name: str,
    *,
    space: str | None,
    seed: str,
    calls: int,
    mode: str,
    checkpoint_dir: Path | None,
    wait_secs: float | None,
) -> str:
    """Submit; with ``wait_secs``, wait until the session ended and return its state."""
    config = agent_config(seed, calls, mode=mode, checkpoint_dir=checkpoint_dir)
    with ClusterStore(db) as store:
        s = submit_session(store, SharedDirectory(sessions_dir), name, config, space=space)
        if wait_secs is None:
            return s.state
        end = time.monotonic() + wait_secs
        while s.state in ("pending", "running") and time.monotonic() < end:
            time.sleep(0.5)
            s = store.session(name)
        return f"{s.state} {s.reason}".strip()


def run_worker(
    db: str,
    worker_id: str,
    work_dir: Path,
    *,
    campaign: str | None,
    claim_ttl: float,
    until_empty: bool,
) -> int:
    """Work the queue; the number of records stored."""
    import signal

    from durable_spaces.campaigns.cluster.workers import ClusterWorker

    _logging()
    w = ClusterWorker(
        db, worker_id, work_dir, campaign=campaign, claim_ttl=claim_ttl, until_empty=until_empty
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: w.stopping.set())
    return w.run()
