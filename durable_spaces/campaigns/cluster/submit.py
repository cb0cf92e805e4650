"""Submitting durable sessions to the cluster (``durable-spaces submit``, and for tests and
campaigns ``submit_session``).

A session is its store row (``create_session``, with its durable Space created first)
plus its state directory in the shared ``SessionFiles`` (``drive.py``): the driver's
configuration is written there *before* the row exists, so no coordinator ever claims a
session it cannot drive. Submitting the same session again is a no-op for the store and
rewrites the configuration only while the session has no log yet.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from durable_spaces.campaigns.agent import AgentConfigFile
from durable_spaces.cluster.drive import SessionFiles
from durable_spaces.cluster.records import SessionRecord, check_name
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.drive import protocol
from durable_spaces.drive.entry import LOG_FILE
from durable_spaces.errors import ConfigError

MODES = ("transactional", "checkpoint", "auto")


def agent_config(
    seed: str,
    calls: int,
    *,
    mode: str = "transactional",
    checkpoint_dir: str | Path | None = None,
    sleep: float = 0.05,
) -> AgentConfigFile:
    """The scripted agent's configuration for a session on remote Spaces.
    ``checkpoint_dir``: a ``DirectoryCheckpointStore`` every driver reaches (needed by
    checkpoint mode to survive a Space placed again from scratch)."""
    if mode not in MODES:
        raise ConfigError(f"durable mode {mode!r}: use one of {', '.join(MODES)}")
    if not isinstance(calls, int) or calls < 1:
        raise ConfigError(f"calls {calls!r}: must be a positive integer")
    return AgentConfigFile(
        backend="remote",
        backend_dir="",  # filled in per session: <state dir>/remote
        mode=mode,
        seed=seed,
        calls=calls,
        store_dir=str(checkpoint_dir) if checkpoint_dir is not None else None,
        sleep=sleep,
    )


def submit_session(
    store: ClusterStore,
    files: SessionFiles,
    name: str,
    config: AgentConfigFile,
    *,
    space: str | None = None,
) -> SessionRecord:
    """Create session ``name`` (driving durable Space ``space``, created if new)."""
    check_name("session", name)
    if space is not None:  # drivers get it as CUA_SESSION_SPACE: the stricter rule
        protocol.parse_space(protocol.SPACE, space)
    state_dir = files.state_dir(name)
    if not (state_dir / LOG_FILE).exists():
        replace(config, backend_dir=str(state_dir / "remote")).save(state_dir)
    if space is not None:
        store.create_space(space)
    return store.create_session(name, space)
