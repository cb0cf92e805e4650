"""``exhaustive``: one kill at every failpoint hit of an uninterrupted run, systematically.

Before the campaign, one calm run of the seed base's script writes its failpoint trace
(``trace_hits``); every ``(point, n)`` hit it lists becomes a run of its own, seeded
``<base>-<point>-<n>``, whose schedule is that single kill (``schedules``): every hit of
every point the run passes, the log's commits and the harness's steps as much as the
adapter's, but a point ``chaos/points.py`` names not killable, with why. Every such run
replays the script of ``<base>``, the one whose trace listed the points.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from durable_spaces.campaigns.scenarios.base import Context, OneSession, Script, shell_sleep
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.chaos import points
from durable_spaces.chaos.schedule import AttemptPlan, Failpoint, Schedule, exhaustive, read_trace
from durable_spaces.drive.coordinator import Launch


def base_seed(run: RunSpec) -> str:
    """``<base>`` of a run seeded ``<base>-<point>-<n>`` (the seed itself otherwise)."""
    return run.seed.rsplit("-", 2)[0] if run.seed.count("-") >= 2 else run.seed


def script_of(seed_base: str) -> Script:
    """The script of the trace of a campaign of ``seed_base``, and of its every run."""
    return Script(seed_base, shell_sleep(seed_base))


class Exhaustive(OneSession):
    name = "exhaustive"

    def script(self, run: RunSpec) -> Script:
        return script_of(base_seed(run))

    def schedule(self, run: RunSpec) -> Schedule:
        """The single kill the seed names."""
        _base, point, n = run.seed.rsplit("-", 2)
        plan = AttemptPlan(failpoint=Failpoint(point, int(n)))
        return Schedule(run.seed, (plan,), "exhaustive")


async def trace_hits(ctx: Context) -> list[tuple[str, int]]:
    """The failpoint hits of one uninterrupted session of the run ``ctx`` is for."""
    trace = ctx.root / "trace.txt"

    def arm_trace(launch: Launch) -> None:
        launch.env["DS_FAILPOINT_TRACE"] = str(trace)

    result = await ctx.coordinator(before_launch=[arm_trace]).run()
    if result.status != "done":
        raise RuntimeError(f"the tracing run ended {result.status}: {result.reason}")
    if not trace.exists():  # no hit was traced (failpoints off): no schedule, no run
        return []
    return read_trace(trace)


def schedules(hits: list[tuple[str, int]], seed_base: str) -> list[Schedule]:
    """One single-kill schedule per hit of every point the uninterrupted run passed
    (``trace_hits``), in the trace's order; a point ``chaos/points.py`` names not
    killable (``points.NOT_KILLABLE``, with why) gets none."""
    return exhaustive((f"{p} {n}" for p, n in hits if p not in points.NOT_KILLABLE), seed_base)


#: The file beside the uninterrupted run's trace that says what it passed (``plan_of``).
PLAN = "plan.json"


def plan_of(hits: list[tuple[str, int]]) -> dict[str, Any]:
    """What the campaign keeps of its uninterrupted run (``campaign.json``'s
    ``exhaustive``, read by ``campaigns/trace_coverage.py``'s ``killed_at``): how many
    times it passed each point, and the points among them a kill makes no sense at, with
    why (they get no run)."""
    passed = Counter(p for p, _ in hits)
    return {
        "passed": dict(sorted(passed.items())),
        "not_killable": {
            p: points.NOT_KILLABLE[p] for p in sorted(passed) if p in points.NOT_KILLABLE
        },
    }


def save_plan(work_dir: Path, hits: list[tuple[str, int]]) -> Path:
    path = work_dir / PLAN
    path.write_text(json.dumps(plan_of(hits), indent=1) + "\n")
    return path


SCENARIO = Exhaustive()
