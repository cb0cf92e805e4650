"""Every verdict of a run comes out of one composition (``campaigns/evidence.py``): the
checker's checks, the run's own (``space``, ``coordinator``) and the scenario's, over a
real hand-built log and workspace; a raising check is unknown whichever kind it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from checker_scenes import scene

from durable_spaces.campaigns.checker import CHECKS, merge
from durable_spaces.campaigns.evidence import RUN_CHECKS, Evidence, judge, run_checks
from durable_spaces.campaigns.scenarios import known_scenarios
from durable_spaces.campaigns.scenarios.base import get


def test_a_consistent_run_passes_every_check_of_every_scenario_s_set(tmp_path: Path) -> None:
    s = scene(tmp_path)
    ev = Evidence("ds-x", True, "done", inputs=s.inputs())
    verdicts = judge(ev, {})
    assert set(verdicts) == set(CHECKS) | set(RUN_CHECKS)
    # same_as_uninterrupted has no workload to replay here: unknown, the rest valid
    assert {k for k, v in verdicts.items() if v["valid"] is not True} == {"same_as_uninterrupted"}
    assert verdicts["space"]["detail"] == "Space ds-x is there after the run"
    for name in known_scenarios():
        assert set(run_checks(get(name).checks())) >= set(CHECKS) | set(RUN_CHECKS), name


def test_a_session_that_did_not_end_done_is_a_failed_check(tmp_path: Path) -> None:
    inputs = scene(tmp_path).inputs()
    ev = Evidence("ds-x", True, "exhausted", "attempt cap 24 reached", inputs=inputs)
    v = judge(ev, {})["coordinator"]
    assert v == {"valid": False, "detail": "session ended exhausted: attempt cap 24 reached",
                 "anomalies": []}  # fmt: skip


def test_a_gone_space_fails_space_and_leaves_the_checker_s_checks_unknown() -> None:
    ev = Evidence("ds-x", False, "done", missing="Space ds-x is gone after the run")
    verdicts = judge(ev, {})
    assert verdicts["space"]["valid"] is False
    assert verdicts["space"]["detail"] == "Space ds-x is gone after the run"
    for name in CHECKS:
        assert verdicts[name] == {
            "valid": None,
            "anomalies": [],
            "detail": "not checked: Space ds-x is gone after the run",
        }
    assert merge(verdicts) is False


def test_no_log_leaves_everything_but_the_session_unknown() -> None:
    verdicts = judge(Evidence("ds-x", None, "done", missing="no log was written"), {})
    assert verdicts["coordinator"]["valid"] is True
    assert {k for k, v in verdicts.items() if v["valid"] is None} == set(CHECKS) | {"space"}
    assert merge(verdicts) is None


def test_a_raising_scenario_check_is_unknown_and_a_name_taken_twice_is_refused(
    tmp_path: Path,
) -> None:
    def broken(ev: Evidence) -> dict[str, object]:
        raise KeyError("old_exit")

    ev = Evidence("ds-x", True, "done", inputs=scene(tmp_path).inputs())
    v = judge(ev, {"mine": broken})["mine"]
    assert v["valid"] is None and v["detail"] == "check raised KeyError: 'old_exit'"
    with pytest.raises(ValueError, match="named twice: space"):
        run_checks({"space": broken})
    with pytest.raises(ValueError, match="named twice: finished"):
        run_checks({"finished": broken})
