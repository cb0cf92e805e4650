"""SUMMARY format and parser, run records, the Jepsen merge, and the shrinker."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_spaces.campaigns.record import Check, RunRecord, load_records, merge_valid
from durable_spaces.campaigns.shrink import shrink
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.campaigns.summary import Summary, parse_summary, percentile, summary_line
from durable_spaces.chaos.schedule import AttemptPlan, Failpoint, Schedule, SpaceFault


def rec(i: int, **kw: object) -> RunRecord:
    return RunRecord(f"run-{i:04d}", f"b-{i}", "transactional", "local", 5, **kw)  # type: ignore[arg-type]


def test_summary_exact_line_and_round_trip() -> None:
    rs = [
        rec(
            0,
            kills=2,
            schedule=Schedule(
                "s-0",
                (AttemptPlan(Failpoint("a", 1), kill_after_s=(0.5,)), AttemptPlan(Failpoint("b"))),
            ).to_json(),
            faults={"kill": 2, "space_remove": 1},
            recoveries={"adopted": 2},
            resume_latencies_ms=[100.0, 300.0],
        ),
        rec(
            1,
            kills=1,
            faults={"kill": 1, "daemon_kill": 1},
            recoveries={"restored": 1, "adopted": 1},
            resume_latencies_ms=[200.0],
        ),
        rec(2, outcome="failed"),
        rec(3, outcome="error"),
    ]
    line = summary_line(rs, mode="transactional", backend="local", seed_base="b")
    assert line == (
        "SUMMARY mode=transactional backend=local runs=4 ok=2 failed=2 lab_errors=0 kills=3 "
        "planned_kills=3 faults=daemon_kill:1,kill:3,space_remove:1 "
        "recoveries=adopted:3,restored:1 resume_p50_ms=200 resume_p95_ms=290 seed_base=b"
    )
    s = parse_summary(line)
    assert s.faults == {"daemon_kill": 1, "kill": 3, "space_remove": 1}
    assert (s.kills, s.planned_kills) == (3, 3)
    assert s.line() == line
    # a line written before planned_kills existed still reads (as 0 planned)
    old = parse_summary(line.replace(" planned_kills=3", ""))
    assert (old.kills, old.planned_kills) == (3, 0)


def test_summary_without_samples_or_faults() -> None:
    line = Summary.of([rec(0)], mode="auto", backend="spacesd", seed_base="z").line()
    assert line.endswith("faults=- recoveries=- resume_p50_ms=n/a resume_p95_ms=n/a seed_base=z")
    assert Summary.parse(line) == Summary.of(
        [rec(0)], mode="auto", backend="spacesd", seed_base="z"
    )
    extra = Summary.parse(line + " drives=3 races=1")  # scenarios append fields of their own
    assert extra.extra == {"drives": "3", "races": "1"}
    assert extra.line() == line + " drives=3 races=1"
    with pytest.raises(ValueError):
        Summary.parse(line + " Bad=1")
    with pytest.raises(ValueError):
        Summary.parse(line.replace("SUMMARY", "Summary"))


def test_percentile_matches_numpy_linear() -> None:
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 95) == pytest.approx(4.8)
    assert percentile([], 50) is None


def test_merge_false_beats_unknown_beats_true() -> None:
    assert merge_valid([True, None, False]) is False
    assert merge_valid([True, None]) is None
    assert merge_valid([True, True]) is True
    assert merge_valid([]) is True
    r = rec(0, checks={"a": Check(valid=True, detail=""), "b": Check(valid=None, detail="?")})
    assert r.settle().outcome == "failed" and r.failing_checks() == ["b"]


def test_record_json_round_trip(tmp_path: Path) -> None:
    r = rec(
        7,
        schedule=Schedule("b-7").to_json(),
        faults={"kill": 1},
        checks={"x": Check(valid=False, detail="no")},
        extra={"epochs": [1, 2]},
    ).settle()
    r.save(tmp_path / "runs")
    (back,) = load_records(tmp_path)
    assert back == r and back.outcome == "failed"


def _spec(calls: int, sched: Schedule) -> RunSpec:
    return RunSpec("run-0000", sched.seed, "transactional", "local", calls, schedule=sched)


def test_shrink_finds_the_minimal_failure_and_counts_passes() -> None:
    sched = Schedule(
        "s",
        (
            AttemptPlan(Failpoint("spawn", 7), (0.8,), (SpaceFault("space_remove", at_s=0.3),)),
            AttemptPlan(
                Failpoint("exit", 2), (), (SpaceFault("daemon_kill", trigger="after_kill"),)
            ),
        ),
    )

    # the planted bug: a kill at "spawn" on hit 3 or later, in a run of at least 4 calls
    def still_fails(s: RunSpec) -> bool:
        assert s.schedule is not None
        return s.calls >= 4 and any(
            a.failpoint is not None and a.failpoint.name == "spawn" and a.failpoint.n >= 3
            for a in s.schedule.attempts
        )

    start = _spec(20, sched)
    assert still_fails(start)
    res = shrink(start, still_fails)
    assert res.spec.calls == 4
    assert res.spec.schedule == Schedule("s", (AttemptPlan(Failpoint("spawn", 3)),), "shrunk")
    assert still_fails(res.spec)
    assert res.stats["drop_fault"]["accepted"] == 2
    assert res.stats["drop_kill"]["accepted"] == 2  # the random kill and the exit failpoint
    assert res.stats["halve_calls"]["accepted"] >= 1
    assert res.stats["kill_earlier"]["accepted"] >= 1
    assert res.shrunk and not res.budget_exhausted


def test_shrink_respects_its_budget() -> None:
    sched = Schedule("s", (AttemptPlan(Failpoint("spawn", 9)),))
    res = shrink(_spec(50, sched), lambda s: True, max_calls=3)
    assert res.calls == 3 and res.budget_exhausted


_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=12)
_counts = st.dictionaries(_word, st.integers(min_value=1, max_value=10**6), max_size=5)
_ms = st.none() | st.integers(min_value=0, max_value=10**7)


@given(
    st.builds(
        Summary,
        mode=_word,
        backend=_word,
        seed_base=_word,
        runs=st.integers(0, 10**6),
        ok=st.integers(0, 10**6),
        failed=st.integers(0, 10**6),
        kills=st.integers(0, 10**6),
        faults=_counts,
        recoveries=_counts,
        resume_p50_ms=_ms,
        resume_p95_ms=_ms,
    )
)
def test_any_summary_round_trips(s: Summary) -> None:
    assert Summary.parse(s.line()) == s
