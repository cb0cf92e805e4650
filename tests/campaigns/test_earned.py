"""A green campaign must have tested something (``campaigns/earned.py``): the rule on
records, and real campaigns under the mutant that turns every failpoint off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from durable_spaces.campaigns import earned
from durable_spaces.campaigns.earned import Tolerance, shortfall
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.spec import CampaignSpec
from durable_spaces.campaigns.summary import Summary
from durable_spaces.chaos.schedule import AttemptPlan, Failpoint, Schedule

#: Two attempts, each killed at a failpoint; the second also at a random time.
PLAN = Schedule(
    "s", (AttemptPlan(Failpoint("adapter.call", 2)), AttemptPlan(Failpoint("adapter.exit"), (0.4,)))
)


def rec(i: int, kills: int = 0, failpoint: int = 0, plan: Schedule | None = PLAN,
        outcome: str = "ok") -> RunRecord:  # fmt: skip
    faults = {"failpoint": failpoint, "random_kill": kills - failpoint}
    return RunRecord(
        f"run-{i:04d}", f"s-{i}", "transactional", "local", 4,
        schedule=None if plan is None else plan.to_json(),
        kills=kills, faults={k: v for k, v in faults.items() if v}, outcome=outcome,
    )  # fmt: skip


def test_the_schedule_counts_kills_not_pauses() -> None:
    assert (PLAN.planned_kills, PLAN.planned_failpoint_kills) == (3, 2)
    paused = Schedule("p", (AttemptPlan(Failpoint("adapter.call", 1, "pause")),))
    assert (paused.planned_kills, paused.planned_failpoint_kills) == (0, 0)
    assert paused.size()[0] == 1  # the shrinker still counts the pause as a fault
    assert earned.tally([rec(0, plan=paused)]).planned_at_failpoints == 1


def test_no_run_is_untested() -> None:
    assert shortfall([], Tolerance()) == "ran no run"
    assert earned.exit_code([], "ran no run") == earned.EXIT_UNTESTED == 4


def test_kills_short_of_the_tolerance_are_named() -> None:
    tol = Tolerance(min_kill_fraction=0.25)
    ok = [rec(i, kills=1, failpoint=1) for i in range(4)]  # 4 of 12 planned
    assert shortfall(ok, tol) is None
    short = [rec(0, kills=1, failpoint=1), *(rec(i) for i in range(1, 4))]  # 1 of 12
    why = shortfall(short, tol)
    assert why is not None and "kills=1 of planned_kills=12" in why and "the 3 " in why


def test_random_kills_alone_do_not_stand_for_faults_at_failpoints() -> None:
    only_random = [rec(i, kills=2, failpoint=0) for i in range(4)]
    why = shortfall(only_random, Tolerance())
    assert why is not None and "none of the 8 faults planned at failpoints landed" in why
    assert shortfall(only_random, Tolerance(at_failpoints=False)) is None
    # a fault that met its point at a failpoint's stop shows the failpoints fire (random
    # kills may have pre-empted every failpoint kill); a timed one, or one cancelled, not
    met = {"attempt": 0, "type": "ok", "kind": "daemon_kill", "at": {"point": "a", "n": 1}}
    timed = {**met, "at": {"after_s": 0.3, "point": "a", "n": 1}}
    cancelled = {**met, "type": "cancelled"}
    for steps, ok in (([met], True), ([timed], False), ([cancelled], False), ("junk", False)):
        runs = [rec(0, kills=2), *(rec(i, kills=2) for i in range(1, 4))]
        runs[0].extra["interleaving"] = steps
        assert (shortfall(runs, Tolerance()) is None) is ok, steps


def _traced(hits: list[dict[str, int]]) -> RunRecord:
    r = rec(0, kills=1, failpoint=0)
    r.attempts = len(hits)
    r.extra["trace"] = [{"attempt": i, "hits": h} for i, h in enumerate(hits)]
    return r


def test_a_failpoint_a_random_kill_pre_empted_was_not_reached_and_is_excused() -> None:
    # PLAN: adapter.call's 2nd hit in attempt 0, adapter.exit's 1st in attempt 1
    early = _traced([{"harness.admit": 1, "adapter.call": 1}])  # killed before the 2nd
    assert earned.tally([early]).reached_at_failpoints == 0
    assert shortfall([early], Tolerance(min_kill_fraction=0)) is None
    # the trace saw adapter.call's 2nd hit and nothing landed there: not excused
    passed = _traced([{"adapter.call": 2}, {"harness.admit": 3}])
    assert earned.tally([passed]).reached_at_failpoints == 1
    why = shortfall([passed], Tolerance(min_kill_fraction=0))
    assert why is not None and "1 of them at a hit the trace saw" in why
    # traces that count no hit at all: the failpoints are silent
    silent = _traced([{}, {}])
    why = shortfall([silent], Tolerance(min_kill_fraction=0))
    assert why is not None and "traces count no failpoint hit" in why
    # junk in a record's trace counts nothing and breaks nothing
    junk = _traced([{"adapter.call": 2}])
    junk.extra["trace"] += ["x", {"attempt": "1", "hits": {"adapter.exit": 9}}, {"attempt": 1}]
    assert earned.tally([junk]).reached_at_failpoints == 1


def test_an_exhaustive_run_whose_point_came_fewer_times_is_excused() -> None:
    """An exhaustive run planned at a point's 4th hit (the uninterrupted run passed it 4
    times) that this time passed it 3 times (a point passed while a command is polled)
    had no kill to land; one whose trace saw the 4th hit and landed nothing did."""
    plan = Schedule("x", (AttemptPlan(Failpoint("adapter.running", 4)),))
    tol = Tolerance(min_kill_fraction=0, at_failpoints=False, kill_every_run=True)

    def run(hits: int) -> RunRecord:
        r = rec(1, plan=plan)
        r.attempts = 1
        r.extra["trace"] = [{"attempt": 0, "hits": {"adapter.running": hits}}]
        return r

    landed = rec(0, kills=1, failpoint=1, plan=plan)
    assert shortfall([landed, run(3)], tol) is None
    why = shortfall([landed, run(4)], tol)
    assert why is not None and "1 of 2 runs" in why and "run-0001" in why


def test_every_run_scenarios_name_the_run_without_its_kill() -> None:
    runs = [rec(0, kills=1, failpoint=1), rec(1), rec(2, kills=1, failpoint=1)]
    assert shortfall(runs, Tolerance()) is None
    why = shortfall(runs, Tolerance(kill_every_run=True))
    assert why is not None and "1 of 3 runs" in why and "run-0001" in why
    assert CampaignSpec(mode="server", backend="microvm").tolerance.kill_every_run
    assert CampaignSpec(scenario="exhaustive").tolerance.kill_every_run
    assert not CampaignSpec(mode="transactional").tolerance.kill_every_run


def test_a_campaign_that_planned_no_kill_needs_only_to_have_run() -> None:
    calm = [rec(i, plan=None) for i in range(3)] + [rec(3, plan=Schedule("c"))]
    assert shortfall(calm, Tolerance(kill_every_run=True)) is None


def test_a_failure_or_a_lab_error_outranks_untested() -> None:
    assert earned.exit_code([rec(0, outcome="failed")], "ran no run") == 1
    assert earned.exit_code([rec(0, outcome="lab_error"), rec(1)], "x") == 3
    assert earned.exit_code([rec(0)], None) == 0


def _campaign(out: Path, mutant: bool, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DS_MUTANTS", "CI")}
    if mutant:
        env["DS_MUTANTS"] = "failpoints_off"
    argv = [sys.executable, "-m", "durable_spaces.cli", "campaign", "--backend", "local",
            "--out", str(out), "--no-progress", "--no-report", "--retries", "0", *args]  # fmt: skip
    return subprocess.run(argv, cwd=out.parent, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip


def test_a_campaign_whose_failpoints_never_fire_exits_4_naming_the_shortfall(
    tmp_path: Path,
) -> None:
    args = ("--mode", "transactional", "--runs", "4", "--calls", "6", "--seed-base", "ci-tx")
    broken = _campaign(tmp_path / "broken", True, *args)
    assert broken.returncode == 4, broken.stdout[-2000:] + broken.stderr[-2000:]
    lines = broken.stdout.splitlines()
    s = Summary.parse(lines[-1])
    assert (s.runs, s.ok, s.failed) == (4, 4, 0)  # every check passed: nothing was tested
    assert s.planned_kills > s.kills
    # what it names depends on how many random-time kills the machine's speed let land
    assert lines[-2].startswith("UNTESTED "), lines
    assert "faults planned at failpoints landed" in lines[-2] or "planned_kills=" in lines[-2]
    # the same seeds on the real build land their kills and pass
    fixed = _campaign(tmp_path / "fixed", False, *args)
    assert fixed.returncode == 0, fixed.stdout[-2000:] + fixed.stderr[-2000:]
    s = Summary.parse(fixed.stdout.splitlines()[-1])
    assert s.runs == 4 and s.failed == 0 and s.faults.get("failpoint", 0) >= 1
    assert not any(ln.startswith("UNTESTED") for ln in fixed.stdout.splitlines())


def test_an_exhaustive_campaign_whose_trace_finds_no_hit_exits_4(tmp_path: Path) -> None:
    r = _campaign(tmp_path / "ex", True, "--scenario", "exhaustive", "--calls", "2",
                  "--seed-base", "ex-off")  # fmt: skip
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[-2] == "UNTESTED ran no run: the trace found no failpoint hit", lines
    assert Summary.parse(lines[-1]).runs == 0


@pytest.mark.parametrize("mutant", [False, True], ids=["real", "failpoints_off"])
def test_the_mutant_silences_the_trace_too(tmp_path: Path, mutant: bool) -> None:
    trace = tmp_path / "trace"
    env = {**os.environ, "DS_FAILPOINT_TRACE": str(trace), "DS_MUTANTS": "failpoints_off"}
    if not mutant:
        env.pop("DS_MUTANTS")
    code = "from durable_spaces.chaos.failpoints import hit; hit('adapter.call')"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert trace.exists() is not mutant
