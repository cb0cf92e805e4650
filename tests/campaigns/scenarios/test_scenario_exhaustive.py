"""The exhaustive scenario: single-kill schedules named by their seeds, one at every hit
of every point the uninterrupted run passed, every run of a campaign replaying the
script its trace came from, and a real trace on local."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from durable_spaces.campaigns.run import exhaustive_schedules, run_one
from durable_spaces.campaigns.scenarios.base import get
from durable_spaces.campaigns.scenarios.exhaustive import (
    PLAN,
    base_seed,
    plan_of,
    schedules,
)
from durable_spaces.campaigns.spec import CampaignSpec, RunSpec
from durable_spaces.chaos import points
from durable_spaces.chaos.schedule import Failpoint, read_trace


def test_a_run_s_seed_names_its_kill_and_its_script() -> None:
    ex = get("exhaustive")
    run = RunSpec("r", "my-base-adapter.exit-2", "exhaustive", "local", 4)
    assert base_seed(run) == "my-base"
    assert ex.script(run) == get("random").script(run.with_(seed="my-base"))
    (plan,) = ex.schedule(run).attempts
    assert plan.failpoint == Failpoint("adapter.exit", 2)


def test_every_hit_of_every_passed_point_becomes_a_schedule_but_the_not_killable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The log's commits and the harness's steps too (they were never killed at: a crash
    right after a commit and before its caller returns); a point chaos/points.py names
    not killable gets none, and the plan says why."""
    hits = [("adapter.call", 1), ("log.after_commit", 1), ("harness.admit", 1),
            ("space.local.server_forked", 1), ("adapter.call", 2)]  # fmt: skip
    got = schedules(hits, "b")
    assert [s.seed for s in got] == [f"b-{p}-{n}" for p, n in hits]
    assert plan_of(hits) == {
        "passed": {"adapter.call": 2, "harness.admit": 1, "log.after_commit": 1,
                   "space.local.server_forked": 1},
        "not_killable": {},
    }  # fmt: skip
    monkeypatch.setitem(points.NOT_KILLABLE, "harness.admit", "the reason")
    assert "b-harness.admit-1" not in [s.seed for s in schedules(hits, "b")]
    assert plan_of(hits)["not_killable"] == {"harness.admit": "the reason"}


@pytest.mark.slow
def test_a_traced_campaign_s_first_kill_runs_and_passes(tmp_path: Path) -> None:
    spec = CampaignSpec(scenario="exhaustive", backend="local", seed_base="ex-t", calls=2, jobs=1)
    scheds = exhaustive_schedules(spec, tmp_path / "trace")
    hits = read_trace(tmp_path / "trace" / "trace.txt")
    killable = [f"{p}-{n}" for p, n in hits if p not in points.NOT_KILLABLE]
    assert [s.seed.removeprefix("ex-t-") for s in scheds] == killable
    plan = json.loads((tmp_path / "trace" / PLAN).read_text())
    assert plan == plan_of(hits)
    assert {"log.after_commit", "harness.admit", "space.local.forked"} <= set(plan["passed"])
    run = spec.run(0, str(tmp_path / "state"), scheds[0])
    rec = asyncio.run(run_one(run))
    assert rec.outcome == "ok", rec.checks
    assert rec.kills == 1 and rec.scenario == "exhaustive"
