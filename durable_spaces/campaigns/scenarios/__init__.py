"""The scenarios a campaign run can be, by name: how it is driven and what it must satisfy.

A scenario is one module with an object that satisfies ``base.Scenario``: the run's
script (``script``), its schedule when none is given (``schedule``), how it is driven
(``drive``, with what ``campaigns/run.py`` lends it) and the checks it adds to the
composition every run is judged by (``checks``). The registry below names them; a
scenario module is imported only when a run asks for it (``base.get``), so ``campaigns/spec.py`` can
check names and requirements without importing any drive machinery.

- ``random``: the drawn schedule (failpoints, random kills, pauses, Space faults) against
  the adapter in transactional, auto or checkpoint mode (``drawn.py``);
- ``stale``: an older driver runs on (often paused at a Space mutation) while a newer one
  takes over; it must be fenced (``stale.py``);
- ``exhaustive``: one kill at every failpoint hit of an uninterrupted run (``exhaustive.py``);
- ``server``: a process started at step 0 must survive a machine checkpoint's restore
  (``server.py``, microvm only);
- ``redrive``: sessions through a whole cluster of their own (PostgreSQL, hosts in
  network namespaces, coordinators; ``durable_spaces/cluster/``) and one fault of seven
  kinds; it runs whole (``run_whole``) and adds counters to the SUMMARY line
  (``redrive.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_spaces.errors import ConfigError


@dataclass(frozen=True)
class Tolerance:
    """How much of what a campaign's schedules planned must land for it to pass (the rule
    is ``campaigns/earned.py``'s, whose module doc says why these three): the kills that
    landed at least ``min_kill_fraction`` of the planned ones (and one); one fault at
    a failpoint at least when any was planned there (``at_failpoints``); a kill
    in every run that plans one (``kill_every_run``)."""

    min_kill_fraction: float = 0.05
    at_failpoints: bool = True
    kill_every_run: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_kill_fraction <= 1.0:
            raise ValueError(f"min_kill_fraction must be in [0, 1], not {self.min_kill_fraction}")


@dataclass(frozen=True)
class Registration:
    """Where a scenario lives (``module:attribute``) and what it asks of a campaign."""

    target: str
    #: The adapter mode a run of it gets when none is named.
    default_mode: str = "transactional"
    #: The one backend it can run on (None: any), and why.
    backend: str | None = None
    why_backend: str = ""
    #: The adapter modes it can test (None: any), and why.
    modes: tuple[str, ...] | None = None
    why_modes: str = ""
    #: Counters its runs keep in ``RunRecord.extra``, summed onto its SUMMARY line.
    summary_fields: tuple[str, ...] = ()
    #: How much of what its schedules plan must land for a campaign of it to pass
    #: (``campaigns/earned.py``; exit 4 otherwise).
    tolerance: Tolerance = field(default_factory=Tolerance)


SCENARIOS: dict[str, Registration] = {
    "random": Registration("durable_spaces.campaigns.scenarios.drawn:SCENARIO"),
    "stale": Registration("durable_spaces.campaigns.scenarios.stale:SCENARIO"),
    "exhaustive": Registration(
        "durable_spaces.campaigns.scenarios.exhaustive:SCENARIO",
        # each run's single kill is at a hit the calm run's trace saw: it must land
        tolerance=Tolerance(kill_every_run=True),
    ),
    "server": Registration(
        "durable_spaces.campaigns.scenarios.server:SCENARIO",
        default_mode="checkpoint",  # processes survive only whole-machine checkpoints
        backend="microvm",
        why_backend="only whole-machine checkpoints bring a process back after a restore",
        modes=("checkpoint",),
        why_modes="its drivers are killed right after a machine checkpoint",
        # that kill is the scenario: a run without it tested no restore of a process
        tolerance=Tolerance(kill_every_run=True),
    ),
    "redrive": Registration(
        "durable_spaces.campaigns.scenarios.redrive:SCENARIO",
        summary_fields=(
            "drives",
            "spaces_replaced",
            "tokens_refused",
            "races",
            "lease_violations",
            "epoch_violations",
        ),
    ),
}
#: The scenario of a run that names none.
DEFAULT = "random"


def known_scenarios() -> list[str]:
    return list(SCENARIOS)


def registration(name: str) -> Registration:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ConfigError(
            f"unknown campaign scenario {name!r}; known: {', '.join(SCENARIOS)}"
        ) from None


__all__ = [
    "DEFAULT",
    "SCENARIOS",
    "Registration",
    "Tolerance",
    "known_scenarios",
    "registration",
]
