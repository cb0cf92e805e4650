"""Fixtures shared by every test folder: a quiet environment and a private state dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Before anything imports cua (at collection time too): no telemetry from any process.
os.environ["DO_NOT_TRACK"] = "1"
os.environ["CUA_TELEMETRY"] = "0"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A fresh directory where a backend keeps its Spaces (unique per test, -n safe)."""
    d = tmp_path / "state"
    d.mkdir()
    return d
