"""The campaign runner with toy sessions (real worker processes)."""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path

import pytest
from campaign_toys import always_ok, fails_on_seed_1, hangs, raises, toy_session, traced

from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.runner import run_campaign, run_one_ref
from durable_spaces.campaigns.spec import CampaignSpec
from durable_spaces.campaigns.summary import Summary
from durable_spaces.chaos.schedule import AttemptPlan, Failpoint, Schedule
from durable_spaces.errors import ConfigError


def test_all_ok_writes_records_and_summary(tmp_path: Path) -> None:
    out = io.StringIO()
    spec = CampaignSpec(mode="auto", backend="local", seed_base="t1", runs=3, calls=2, jobs=2)
    res = run_campaign(spec, always_ok, out_dir=tmp_path, stdout=out, progress=False)
    assert res.exit_code == 0
    lines = out.getvalue().splitlines()
    assert lines == [
        "SUMMARY mode=auto backend=local runs=3 ok=3 failed=0 lab_errors=0 kills=0 "
        "planned_kills=0 faults=- "
        "recoveries=adopted:3 resume_p50_ms=15 resume_p95_ms=20 seed_base=t1"
    ]
    recs = sorted((tmp_path / "runs").glob("*.json"))
    assert [p.name for p in recs] == ["run-0000.json", "run-0001.json", "run-0002.json"]
    assert RunRecord.load(recs[1]).seed == "t1-1"
    meta = json.loads((tmp_path / "campaign.json").read_text())
    assert meta["spec"]["mode"] == "auto" and meta["summary"] == lines[-1]


def test_the_summary_says_how_many_registered_failpoints_the_runs_passed(tmp_path: Path) -> None:
    from durable_spaces.campaigns.trace_coverage import registered_points

    out = io.StringIO()
    spec = CampaignSpec(mode="auto", backend="local", seed_base="t2", runs=2, calls=2, jobs=1)
    run_campaign(spec, traced, out_dir=tmp_path, stdout=out, progress=False)
    line = out.getvalue().splitlines()[-1]
    assert line.endswith(f" coverage=2/{len(registered_points())}"), line
    assert Summary.parse(line).extra["coverage"] == f"2/{len(registered_points())}"


def test_failed_run_exits_nonzero_and_prints_repro(tmp_path: Path) -> None:
    out = io.StringIO()
    spec = CampaignSpec(
        mode="checkpoint", backend="spacesd", seed_base="t2", runs=3, calls=4, jobs=2
    )
    res = run_campaign(spec, fails_on_seed_1, out_dir=tmp_path, stdout=out, progress=False)
    assert res.exit_code == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "REPRO run-0001 (exactly_once): durable-spaces repro --mode checkpoint "
        "--backend spacesd --seed t2-1 --calls 4"
    )
    s = Summary.parse(lines[-1])
    assert (s.runs, s.ok, s.failed, s.kills) == (3, 2, 1, 3)
    cmd = shlex.split(lines[0].split(": ", 1)[1])
    assert cmd[cmd.index("--seed") + 1] == "t2-1"


def test_raising_run_is_an_error_not_a_crash_of_the_campaign(tmp_path: Path) -> None:
    out = io.StringIO()
    spec = CampaignSpec(runs=2, calls=1, jobs=2, seed_base="t3")
    res = run_campaign(spec, raises, out_dir=tmp_path, stdout=out, progress=False)
    assert res.exit_code == 3  # only the lab broke: not a verdict on the adapter
    assert [r.outcome for r in res.records] == ["lab_error", "lab_error"]
    assert "harness broke" in res.records[0].checks["run"]["detail"]


def test_run_one_must_be_importable() -> None:
    with pytest.raises(ValueError):
        run_one_ref(lambda run: run)
    assert run_one_ref(always_ok) == "campaign_toys:always_ok"


def test_spec_from_env_names_the_bad_variable() -> None:
    with pytest.raises(ConfigError, match="CRASH_RUNS"):
        CampaignSpec.from_env({"CRASH_RUNS": "many"})
    with pytest.raises(ConfigError, match="CRASH_MODE"):
        CampaignSpec.from_env({"CRASH_MODE": "chaotic"})
    with pytest.raises(ConfigError, match="CRASH_JOBS"):
        CampaignSpec.from_env({"CRASH_JOBS": "0"})
    s = CampaignSpec.from_env({"CRASH_MODE": "stale", "CRASH_RUNS": "7"}, runs=3, calls=None)
    assert (s.mode, s.runs, s.calls, s.adapter_mode) == ("stale", 3, 6, "transactional")


@pytest.mark.slow
def test_toy_session_campaign_with_explicit_schedules_and_shrinking(tmp_path: Path) -> None:
    """Real coordinators over real toy drivers, killed by failpoints from the schedules."""
    scheds = [
        Schedule("ok-1", (AttemptPlan(failpoint=Failpoint("toy.step", 1)),), "manual"),
        Schedule("bad-4", (AttemptPlan(failpoint=Failpoint("toy.step", 4)),), "manual"),
    ]
    out = io.StringIO()
    spec = CampaignSpec(mode="exhaustive", seed_base="t4", runs=1, calls=5, jobs=2)
    res = run_campaign(
        spec,
        toy_session,
        out_dir=tmp_path,
        stdout=out,
        progress=False,
        schedules=scheds,
        shrink_failures=True,
    )
    assert [r.outcome for r in res.records] == ["ok", "failed"]
    ok = res.records[0]
    assert ok.kills == 1 and ok.attempts == 2 and len(ok.resume_latencies_ms) == 1
    sr = res.shrunk["run-0001"]
    # the smallest still-failing run: killed at the 3rd step of a 3-step script
    assert sr.spec.calls == 3
    assert sr.spec.schedule is not None
    assert sr.spec.schedule.attempts[0].failpoint == Failpoint("toy.step", 3)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(
        "REPRO run-0001 (toy_bug): durable-spaces repro --scenario exhaustive --mode transactional"
    )
    assert "--schedule" in lines[0]
    assert lines[1].startswith("REPRO run-0001 (exact): durable-spaces repro --exact ")
    assert lines[2].startswith("SHRUNK run-0001 (calls 5->3): ")
    assert Summary.parse(lines[-1]).failed == 1


def test_run_timeout_kills_the_worker_and_its_drivers(tmp_path: Path) -> None:
    import psutil

    out = io.StringIO()
    spec = CampaignSpec(runs=1, calls=1, jobs=1, seed_base="t5")
    res = run_campaign(spec, hangs, out_dir=tmp_path, stdout=out, progress=False, run_timeout_s=3.0)
    (rec,) = res.records
    assert rec.outcome == "lab_error" and "timed out" in rec.checks["run"]["detail"]
    launched = (tmp_path / "state" / "run-0000" / "launches.log").read_text().split()
    pid = int(launched[1])
    alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    assert not alive
