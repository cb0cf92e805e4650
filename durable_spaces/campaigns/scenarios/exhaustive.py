"""``exhaustive``: one kill at every failpoint hit of an uninterrupted run, systematically.

Before the campaign, one calm run of the seed base's script writes its failpoint trace
(``trace_hits``); every ``(point, n)`` hit of a kill point becomes a run of its own,
seeded ``<base>-<point>-<n>``, whose schedule is that single kill (``schedules``). Every
such run replays the script of ``<base>``, the one whose trace listed the points.
"""

from __future__ import annotations

from durable_spaces.campaigns.scenarios.base import (
    KILL_POINTS,
    Context,
    OneSession,
    Script,
    shell_sleep,
)
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


#: Beyond the scripted call's points, the steps of a ``local`` Space's spawn (its ledger
#: line, its fork server, its supervisor's record): hit only on that backend.
SPAWN_POINTS = (
    points.SPACE_LOCAL_LEDGER_WRITTEN,
    points.SPACE_LOCAL_SERVER_STARTED,
    points.SPACE_LOCAL_FORKED,
    points.SPACE_LOCAL_SUPERVISOR_RECORDED,
    points.SPACE_LOCAL_SPAWNED,
)


def schedules(hits: list[tuple[str, int]], seed_base: str) -> list[Schedule]:
    """One single-kill schedule per hit of a kill point."""
    kill = (*KILL_POINTS, *SPAWN_POINTS)
    return exhaustive((f"{p} {n}" for p, n in hits if p in kill), seed_base)


SCENARIO = Exhaustive()
