"""The exhaustive scenario: single-kill schedules named by their seeds, every run of a
campaign replaying the script its trace came from, and a real trace on local."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durable_spaces.campaigns.run import exhaustive_schedules, run_one
from durable_spaces.campaigns.scenarios.base import KILL_POINTS, get
from durable_spaces.campaigns.scenarios.exhaustive import SPAWN_POINTS, base_seed, schedules
from durable_spaces.campaigns.spec import CampaignSpec, RunSpec
from durable_spaces.chaos.schedule import Failpoint


def test_a_run_s_seed_names_its_kill_and_its_script() -> None:
    ex = get("exhaustive")
    run = RunSpec("r", "my-base-adapter.exit-2", "exhaustive", "local", 4)
    assert base_seed(run) == "my-base"
    assert ex.script(run) == get("random").script(run.with_(seed="my-base"))
    (plan,) = ex.schedule(run).attempts
    assert plan.failpoint == Failpoint("adapter.exit", 2)


def test_only_kill_points_become_schedules() -> None:
    hits = [("adapter.call", 1), ("log.after_commit", 1), ("space.local.forked", 1),
            ("space.local.server_forked", 1), ("adapter.call", 2)]  # fmt: skip
    got = schedules(hits, "b")
    seeds = ["b-adapter.call-1", "b-space.local.forked-1", "b-adapter.call-2"]
    assert [s.seed for s in got] == seeds
    assert "log.after_commit" not in KILL_POINTS


@pytest.mark.slow
def test_a_traced_campaign_s_first_kill_runs_and_passes(tmp_path: Path) -> None:
    spec = CampaignSpec(scenario="exhaustive", backend="local", seed_base="ex-t", calls=2, jobs=1)
    scheds = exhaustive_schedules(spec, tmp_path / "trace")
    assert len(scheds) >= 2 * 6  # every call passes at least six kill points
    kill = (*KILL_POINTS, *SPAWN_POINTS)
    assert all(s.attempts[0].failpoint.name in kill for s in scheds)  # type: ignore[union-attr]
    assert any(s.attempts[0].failpoint.name == "space.local.forked" for s in scheds)  # type: ignore[union-attr]
    run = spec.run(0, str(tmp_path / "state"), scheds[0])
    rec = asyncio.run(run_one(run))
    assert rec.outcome == "ok", rec.checks
    assert rec.kills == 1 and rec.scenario == "exhaustive"
