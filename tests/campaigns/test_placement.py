"""A run's Placement (the coordinator's side of its Space)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from needs import need

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

from durable_spaces.backends.spacesd import runtime as spacesd_runtime
from durable_spaces.campaigns.run import Placement
from durable_spaces.campaigns.scenarios.base import Script
from durable_spaces.campaigns.spec import RunSpec

pytestmark = [pytest.mark.spacesd]


async def test_a_placement_starts_its_backends_runtime(tmp_path: Path) -> None:
    # A Space fault's boot (or placing a lost Space) in the coordinator's process counts
    # in that resume: the SDK's runtime must be started before, when the run starts.
    need("spacesd")
    spaces = tmp_path / "spaces"
    placement = Placement(
        RunSpec("run-0000", "pl-0", "transactional", "spacesd", 3), spaces, Script("pl-0", 0.0)
    )
    try:
        home = str(spaces.absolute() / ".cua-sdk")
        deadline = time.monotonic() + 10
        while home not in spacesd_runtime._runtimes and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert home in spacesd_runtime._runtimes
    finally:
        await placement.delete()
