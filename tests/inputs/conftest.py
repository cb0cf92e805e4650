"""Fixtures for the bad-input tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory that no bad input may change, with a precious file in it."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "precious").write_text("do not touch\n")
    return d
