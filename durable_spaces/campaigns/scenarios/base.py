"""The interface every scenario has, and what ``campaigns/run.py`` lends it to drive with.

``run_one`` (``campaigns/run.py``) does what every run shares: fresh directories, the
agent's configuration from the scenario's ``Script``, the Space's placement, the
nemesis, the check, the record. A scenario says only what differs:

- ``script(run)``: what the scripted agent does (its seed, its shell steps' sleep,
  whether step 0 starts a server);
- ``schedule(run)``: the faults of a run that was given none;
- ``drive(run, ctx)``: the coordinated session(s) of the run, through the ``Context``
  (``ctx.drive()`` is one coordinator with the run's schedule injected), returning what
  ended it, the injector that carried the faults out, and facts for the record and the
  checks (``Driven``);
- ``checks()``: the checks it adds to every run's composition (``campaigns/evidence.py``).

A scenario never imports ``campaigns/run.py``: what it needs of it comes in ``ctx``.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from durable_spaces.campaigns.evidence import RunCheck
from durable_spaces.campaigns.inject import Injector
from durable_spaces.campaigns.scenarios import registration
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.chaos import points
from durable_spaces.chaos.schedule import Schedule
from durable_spaces.drive.coordinator import Coordinator, CoordinatorResult

#: Failpoints a scripted call passes through: the campaign draws kills among these, and
#: an exhaustive campaign kills at every hit of them.
KILL_POINTS = (
    points.ADAPTER_CALL,
    points.ADAPTER_START_MARK,
    points.ADAPTER_SPAWN,
    points.ADAPTER_RUNNING,
    points.ADAPTER_MID_CALL,
    points.ADAPTER_EXIT,
    points.ADAPTER_FILE_OP,
    points.ADAPTER_OUTCOME_COMMIT,
    points.ADAPTER_CHECKPOINT,
    points.HARNESS_TOOL_RETURNED,
    points.HARNESS_TOOL_RESULT,
    points.HARNESS_INTENT,
    points.RECOVERY_START,
    points.RECOVERY_REVERTED,
    points.RECOVERY_RESTORED,
    points.RECOVERY_REIMAGED,
)


@dataclass(frozen=True)
class Script:
    """What a run's scripted agent does (it goes into ``agent.json``)."""

    seed: str  # the ScriptedModel's seed (the Space is named after it too)
    sleep: float  # seconds each scripted shell command sleeps first
    server: bool = False  # step 0 starts a long-lived process


def shell_sleep(seed: str) -> float:
    """How long each scripted shell command sleeps (widens the mid-command window)."""
    return random.Random(f"{seed}:sleep").choice([0.0, 0.05, 0.2, 0.5])


class Driven(NamedTuple):
    """How a scenario's drive went: what ended the session, the injector that carried
    the faults out, and facts for the record's ``extra`` and the scenario's checks."""

    result: CoordinatorResult
    injector: Injector
    extra: dict[str, Any]


class Context(Protocol):
    """What ``campaigns/run.py`` lends a scenario for one run."""

    #: The run's schedule (given, or the scenario's own).
    schedule: Schedule
    #: The run's state directory.
    root: Path

    def coordinator(self, **options: Any) -> Coordinator:
        """A coordinator of the run's driver, Space and timeouts (``options`` override
        its settings: ``max_attempts``, ``stall_secs``, ``backoff``, ``before_launch``,
        ``kill_orphans``)."""
        ...

    async def drive(
        self,
        schedule: Schedule | None = None,
        *,
        seen: list[Coordinator] | None = None,
        **options: Any,
    ) -> tuple[CoordinatorResult, Injector]:
        """One coordinated session with ``schedule`` (default: the run's) injected; the
        coordinator is appended to ``seen`` as soon as it exists."""
        ...


class Scenario(Protocol):
    name: str

    def script(self, run: RunSpec) -> Script: ...

    def schedule(self, run: RunSpec) -> Schedule: ...

    async def drive(self, run: RunSpec, ctx: Context) -> Driven: ...

    def checks(self) -> Mapping[str, RunCheck]: ...


def get(name: str) -> Scenario:
    """The scenario registered as ``name`` (its module imported now)."""
    module, _, attr = registration(name).target.partition(":")
    scenario: Scenario = getattr(importlib.import_module(module), attr)
    return scenario


class OneSession:
    """The common case, for scenarios to build on: the run's own seed and a drawn sleep,
    one coordinated session with the run's schedule, no checks of its own."""

    name = ""

    def script(self, run: RunSpec) -> Script:
        return Script(run.seed, shell_sleep(run.seed))

    def schedule(self, run: RunSpec) -> Schedule:
        return Schedule.draw(run.seed, KILL_POINTS, run.calls, run.profile)

    async def drive(self, run: RunSpec, ctx: Context) -> Driven:
        result, injector = await ctx.drive()
        return Driven(result, injector, {})

    def checks(self) -> Mapping[str, RunCheck]:
        return {}
