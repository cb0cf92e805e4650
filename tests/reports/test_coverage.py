"""What a campaign tested: failpoint traces read into each attempt's story, coverage per
point and call kind, the checks table, and the SUMMARY's coverage field."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_spaces.campaigns import trace_coverage
from durable_spaces.campaigns.record import Check, RunRecord
from durable_spaces.campaigns.trace_coverage import (
    attempt_story,
    coverage_of,
    killed_at,
    read_hits,
    registered_points,
)
from durable_spaces.chaos import failpoints
from durable_spaces.reports.coverage import checks_table, coverage_table, never_hit_table


def _trace(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{x}\n" for x in lines) + "adapter.exit 9")  # a torn last line
    return path


def test_a_trace_becomes_an_attempt_story(tmp_path: Path) -> None:
    t = _trace(tmp_path / "a0", [
        "harness.intent 1 1 - 100",
        "adapter.call 1 2 bash:call-s0-aa 200",
        "adapter.spawn 1 3 bash:call-s0-aa 300",
        "adapter.running 1 - bash:call-s0-aa 350",
        "adapter.exit 1 4 bash:call-s0-aa 900",
        "not a point 1 5 - 1000",
        "adapter.call 1 6",  # an old three-field line: no call, no time
    ])  # fmt: skip
    hits = read_hits(t)
    assert [h.point for h in hits] == [
        "harness.intent", "adapter.call", "adapter.spawn", "adapter.running", "adapter.exit",
        "adapter.call",
    ]  # fmt: skip
    story = attempt_story(hits, index=0, epoch=1, exit_code=-9)
    assert story["ended_at"] == {"point": "adapter.call", "n": 1, "call": None}
    assert story["calls"] == [
        {"call": "bash:call-s0-aa", "first_us": 200, "last_us": 900,
         "points": ["adapter.call", "adapter.spawn", "adapter.running", "adapter.exit"]},
    ]  # fmt: skip
    assert story["first_us"] == 100 and story["last_us"] == 900
    assert story["hits"]["adapter.call"] == 2


def test_coverage_counts_kills_where_attempts_ended_and_lists_the_points_never_hit() -> None:
    killed = {
        "attempt": 0, "epoch": 1, "exit_code": -9,
        "hits": {"adapter.call": 1, "adapter.exit": 1},
        "calls": [{"call": "bash:call-s2-x", "points": ["adapter.call", "adapter.exit"]}],
        "ended_at": {"point": "adapter.exit", "n": 1, "call": "bash:call-s2-x"},
    }  # fmt: skip
    resumed = {
        "attempt": 1, "epoch": 2, "exit_code": 0,
        "hits": {"recovery.start": 1, "adapter.call": 1},
        "calls": [{"call": "write:call-s3-y", "points": ["adapter.call"]}],
        "ended_at": {"point": "adapter.call", "n": 1, "call": "write:call-s3-y"},
    }  # fmt: skip
    cov = coverage_of([[killed, resumed], "not a list", [{"exit_code": 0}]])
    assert cov.kills == {("adapter.exit", "bash"): 1}  # the clean exit of attempt 1 is no kill
    assert cov.kills_by_step == {("adapter.exit", 2): 1}
    assert cov.recovered == {"adapter.exit": 1}
    assert cov.hits[("adapter.call", "bash")] == 1 and cov.hits[("adapter.call", "write")] == 1
    assert cov.hits[("recovery.start", "-")] == 1
    assert "adapter.spawn" in cov.never_hit and "adapter.exit" not in cov.never_hit
    reg = registered_points()
    assert cov.fraction() == f"3/{len(reg)}"
    assert "adapter.running" not in reg  # a timer point is no position
    table = coverage_table(cov).set_index(["point", "call"])
    assert table.loc[("adapter.exit", "bash"), "killed"] == 1
    assert table.loc[("adapter.exit", "bash"), "recovered_after"] == 1
    assert "adapter.spawn" in set(never_hit_table(cov)["point"])


def test_the_trace_names_the_call_a_hit_is_in(tmp_path: Path) -> None:
    """A hit inside ``in_call`` carries the call; after ``leave_call`` it does not."""
    trace = tmp_path / "t"
    failpoints.arm("", str(trace))
    try:
        token = failpoints.in_call("bash", "call s0;rm")  # hostile characters made words
        failpoints.hit("adapter.call")
        failpoints.leave_call(token)
        failpoints.hit("harness.intent")
    finally:
        failpoints.arm("", None)
    hits = read_hits(trace)
    assert [(h.point, h.call) for h in hits] == [
        ("adapter.call", "bash:call_s0_rm"),
        ("harness.intent", None),
    ]
    assert all(h.t_us is not None for h in hits)


def test_the_checks_table_says_what_each_check_verified() -> None:
    def rec(i: int, checks: dict[str, Check]) -> RunRecord:
        return RunRecord(run_id=f"r{i}", seed="s", mode="m", backend="local", calls=1,
                         checks=checks)  # fmt: skip

    records = [
        rec(0, {"exactly_once": Check(valid=True, detail="3 bash: each once", verified=3),
                "image_follows_calls": Check(valid=True, detail="not transactional (mode c)")}),
        rec(1, {"exactly_once": Check(valid=False, detail="x", verified=2,
                                      anomalies=[{"name": "duplicate_effect"}]),
                "image_follows_calls": Check(valid=None, detail="no log")}),
    ]  # fmt: skip
    t = checks_table(records).set_index("check")
    assert t.loc["exactly_once"].to_dict() == {
        "passed": 1, "failed": 1, "unknown": 0, "not_applicable": 0, "anomalies": 1,
        "verified": 5,
    }  # fmt: skip
    assert t.loc["image_follows_calls", "not_applicable"] == 1
    assert t.loc["image_follows_calls", "unknown"] == 1


def _killed_at(point: str, call: str = "bash:call-s0-x") -> dict[str, object]:
    return {
        "attempt": 0, "epoch": 1, "exit_code": -9, "hits": {point: 1},
        "calls": [{"call": call, "points": [point]}],
        "ended_at": {"point": point, "n": 1, "call": call},
    }  # fmt: skip


def test_the_coverage_line_says_passed_killed_at_and_not_killable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = [[_killed_at("log.after_commit")], [_killed_at("adapter.exit")]]
    passed = {**_killed_at("harness.admit"), "exit_code": 0}
    cov = coverage_of([*runs, [passed]])
    reg = len(registered_points())
    assert cov.line() == (
        f"3/{reg} registered failpoints passed; killed at 2 of them (2 kills); not killable: none"
    )
    monkeypatch.setattr(trace_coverage, "NOT_KILLABLE", {"harness.admit": "why not"})
    assert cov.line().endswith("not killable: harness.admit")


def test_an_exhaustive_plan_is_held_against_where_kills_landed() -> None:
    """What its uninterrupted run passed, less what a kill makes no sense at, must all
    be killed at; a point missed is named."""
    cov = coverage_of([[_killed_at("log.after_commit")], [_killed_at("adapter.exit")]])
    plan = {
        "passed": {"log.after_commit": 14, "adapter.exit": 2, "harness.admit": 1},
        "not_killable": {"harness.admit": "the reason"},
    }
    k = killed_at(cov, plan)
    assert k is not None and k.fraction() == "2/2" and k.missed == []
    assert k.line() == (
        "the uninterrupted run passed 3 failpoints (17 hits); killed at 2 of them; "
        "not killable: harness.admit (the reason)"
    )
    k = killed_at(cov, {**plan, "not_killable": {}})
    assert k is not None and k.fraction() == "2/3" and k.missed == ["harness.admit"]
    assert k.line().endswith("; never killed at: harness.admit")


@pytest.mark.parametrize(
    "plan",
    [None, [], {"passed": {}}, {"passed": {"no.such.point": 1}, "not_killable": {}},
     {"passed": {"adapter.exit": "1"}, "not_killable": {}},
     {"passed": {"adapter.exit": 1}, "not_killable": {"adapter.call": "x"}},
     {"passed": {"adapter.exit": 1}, "not_killable": {"adapter.exit": 1}}],
)  # fmt: skip
def test_a_plan_read_back_that_is_not_one_is_left_out(plan: object) -> None:
    assert killed_at(coverage_of([]), plan) is None
