"""Fixtures shared by every test folder: a quiet environment, a private state dir, and a
docker Space (skipped, saying why, where Docker or the Space image is missing)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from durable_spaces.backends.docker.space import DockerSpace

# Before anything imports cua (at collection time too): no telemetry from any process.
os.environ["DO_NOT_TRACK"] = "1"
os.environ["CUA_TELEMETRY"] = "0"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A fresh directory where a backend keeps its Spaces (unique per test, -n safe)."""
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
async def docker_space(tmp_path: Path) -> AsyncIterator[DockerSpace]:
    """A new docker Space at epoch 1, its backend's state under ``tmp_path/state``."""
    from durable_spaces.backends.docker.backend import DockerBackend, unavailable_reason

    why = unavailable_reason()
    if why is not None:
        pytest.skip(why)
    b = DockerBackend(tmp_path / "state")
    try:
        sp = await b.create(f"t-{uuid.uuid4().hex[:10]}")
        await sp.advance_epoch(1)
        yield sp
    finally:
        await b.delete_all()
        await b.close()
