"""The stale scenario: its verdict on the old driver from what the drive saw, and a real
stale run on the local backend (a second coordinator takes over while the first one's
driver sleeps at a pause point; the old driver must be fenced)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from durable_spaces.campaigns.checker import CHECKS
from durable_spaces.campaigns.evidence import RUN_CHECKS, Evidence
from durable_spaces.campaigns.run import run_one
from durable_spaces.campaigns.scenarios.stale import stale_driver_fenced
from durable_spaces.campaigns.spec import CampaignSpec

PAUSED = {"name": "space.mutate", "n": 1, "action": "pause", "paused": True}
FACTS: dict[str, tuple[dict[str, Any], bool | None, str]] = {
    "ended-first": ({"stale_overlapped": False, "old_exit": 0}, True, "before the takeover"),
    "fenced": ({"stale_overlapped": True, "old_exit": 75, "stale_pause": PAUSED}, True, "fenced"),
    "finished-unpaused": ({"stale_overlapped": True, "old_exit": 0}, True, "finished before"),
    "halted": ({"stale_overlapped": True, "old_exit": 1}, True, "stopped (exit 1)"),
    "done-while-paused-and-superseded": (
        {"stale_overlapped": True, "old_exit": 0, "stale_pause": PAUSED},
        False,
        "exited 0 while superseded",
    ),
    "permanent-while-superseded": (
        {"stale_overlapped": True, "old_exit": 78},
        False,
        "exited 78 while superseded",
    ),
}


@pytest.mark.parametrize(("facts", "valid", "detail"), FACTS.values(), ids=FACTS.keys())
def test_the_verdict_on_the_old_driver(facts: dict[str, Any], valid: bool, detail: str) -> None:
    v = stale_driver_fenced(Evidence("ds-x", True, "done", facts=facts))
    assert v["valid"] is valid and detail in v["detail"], v


@pytest.mark.slow
def test_a_stale_run_on_local_is_fenced_and_judged_by_one_set_of_checks(tmp_path: Path) -> None:
    spec = CampaignSpec(scenario="stale", backend="local", seed_base="ci-stale", calls=4, jobs=1)
    rec = asyncio.run(run_one(spec.run(1, str(tmp_path))))  # seed ci-stale-1: paused, fenced
    assert rec.outcome == "ok", rec.checks
    assert (rec.scenario, rec.mode, rec.durable_mode) == ("stale", "stale", "transactional")
    assert set(rec.checks) == set(CHECKS) | set(RUN_CHECKS) | {"stale_driver_fenced"}
    assert rec.extra["stale_pause"]["paused"] is True
    assert rec.checks["stale_driver_fenced"]["valid"] is True
    assert rec.repro.startswith("durable-spaces repro --scenario stale --mode transactional ")
