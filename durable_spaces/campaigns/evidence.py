"""What a run is judged on, and the one composition of every check of a run.

The checker's ``Inputs`` (the raw log, the raw workspace, launches, processes) are read
once after the run. Next to them the lab knows what no input holds: how the coordinated
session ended, whether the Space was still there to read, and what the scenario saw as
it drove (``facts``, e.g. a stale run's old driver exit). ``Evidence`` carries both, and
``judge`` runs every check of a run on it through ``checker.compose``, so a check that
raises is unknown whichever kind it is, and every run of a scenario reports one set:

- the checker's checks (``checker.CHECKS``), each unknown, not run, when the inputs could
  not be read (no log was written, the Space was gone);
- the run's own: ``space`` (the Space is there after the run) and ``coordinator`` (the
  session ended ``done``);
- the scenario's (``Scenario.checks()``, ``campaigns/scenarios/``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_spaces.campaigns.checker import CHECKS, CheckFn, Inputs, compose
from durable_spaces.campaigns.checks.verdict import Verdict, passed, unknown


@dataclass
class Evidence:
    space: str  # the run's Space
    #: Whether the Space was found after the run (None: not looked for).
    space_present: bool | None
    status: str  # how the session ended (``CoordinatorResult.status``)
    reason: str = ""
    inputs: Inputs | None = None
    #: Why ``inputs`` is None.
    missing: str = ""
    #: What the scenario saw as it drove (its ``Driven.extra``, also in the record).
    facts: Mapping[str, Any] = field(default_factory=dict)


RunCheck = Callable[[Evidence], Verdict]


def on_inputs(check: CheckFn) -> RunCheck:
    """A checker check as a check of the run: unknown when the inputs are missing."""

    def run(ev: Evidence) -> Verdict:
        if ev.inputs is None:
            return unknown(f"not checked: {ev.missing}")
        return check(ev.inputs)

    run.__doc__ = check.__doc__
    return run


def space_present(ev: Evidence) -> Verdict:
    if ev.space_present is None:
        return unknown(f"not looked for: {ev.missing}")
    if not ev.space_present:
        return {"valid": False, "detail": f"Space {ev.space} is gone after the run"}
    return passed(f"Space {ev.space} is there after the run")


def session_ended(ev: Evidence) -> Verdict:
    if ev.status != "done":
        return {"valid": False, "detail": f"session ended {ev.status}: {ev.reason}"}
    return passed("session ended done")


RUN_CHECKS: dict[str, RunCheck] = {"space": space_present, "coordinator": session_ended}


def run_checks(scenario: Mapping[str, RunCheck]) -> dict[str, RunCheck]:
    """Every check of a run of a scenario that adds ``scenario`` (a name taken twice is
    an error: one verdict per name)."""
    checks = {name: on_inputs(c) for name, c in CHECKS.items()}
    for part in (RUN_CHECKS, scenario):
        taken = sorted(set(part) & set(checks))
        if taken:
            raise ValueError(f"checks named twice: {', '.join(taken)}")
        checks.update(part)
    return checks


def judge(ev: Evidence, scenario: Mapping[str, RunCheck]) -> dict[str, Verdict]:
    """Every verdict of one run (see the module doc)."""
    return compose(run_checks(scenario))(ev)
