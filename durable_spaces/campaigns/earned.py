"""Whether a campaign's green was earned: it ran, and the faults it planned landed.

A campaign judges its runs by their outcomes (``runner.CampaignResult.exit_code``), and
an outcome says only that nothing went wrong that the checker looked at. A campaign that
ran no run, or whose kills never landed (a failpoint that no longer fires, a trace that
lists no hit, a scenario driven in a mode where its fault cannot happen), would pass
having tested nothing. This module is the rule that says so, as a pure function of the
run records and a tolerance: ``shortfall(records, tolerance)`` is None when the campaign
was tested, else a one-line reason, and the campaign exits ``EXIT_UNTESTED``.

Why a tolerance and not "every planned kill landed": a drawn schedule plans faults for
up to ``Profile.faulty_attempts`` attempts, but an attempt runs only if the one before
it died, a failpoint's n-th hit may lie past the run's end (or on a recovery path the
run never took), and a random-time kill drawn after the run finished has no driver to
kill. Measured on the CI seeds (docs/lab-exit-codes.md), between one in eight and one in
five planned kills land; with every failpoint a no-op (the mutant ``failpoints_off``)
none of the failpoint kills does. So the rule asks, per scenario
(``scenarios.Registration.tolerance``):

- ``min_kill_fraction``: the kills that landed are at least this share of the planned
  ones (and at least one when any was planned);
- ``at_failpoints``: when faults were planned at failpoints (a failpoint's kill or pause,
  a fault the driver stops for at a point) and the runs reached them, at least one landed
  there. These land at logical points, whatever the machine's speed; random-time kills do
  not, so they cannot stand in for them. But a random-time kill that comes first (a loaded
  machine) pre-empts every failpoint of its attempt, and a failpoint whose n-th hit lies
  past where its attempt ended had no chance: a fault is *reached* when its attempt's
  trace (``extra.trace``, ``campaigns/trace_coverage.py``) counts its point's n-th hit. Reached
  and not landed is a failpoint that did not fire; a campaign whose traces count no hit
  at all while it planned faults at failpoints has silent failpoints (the mutant
  ``failpoints_off`` silences the trace too). A record without a trace counts every
  fault of an attempt it ran as reached (what could not be told is not excused);
- ``kill_every_run``: each run whose schedule plans a kill lands one (the ``server``
  scenario's kill after a machine checkpoint; an ``exhaustive`` run's single kill, at a
  hit its trace saw), unless its trace shows no planned kill was reached (a point whose
  hits vary with timing, as one passed while a command is polled, may be hit fewer times
  than in the uninterrupted run the exhaustive plan was read from).

A campaign whose schedules plan no kill (``--profile calm``, or a redrive campaign,
whose faults are played by its own lab) is held only to having run. The probe (another
lab, the same question) calls ``shortfall`` with a tolerance of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.scenarios import Tolerance
from durable_spaces.chaos.faults import AttemptPlan
from durable_spaces.chaos.schedule import Schedule

if TYPE_CHECKING:
    from durable_spaces.campaigns.spec import CampaignSpec

#: A campaign's exit codes (``durable-spaces campaign``); 2 is a usage error.
EXIT_OK = 0
EXIT_FAILED = 1  # a run's check of the system under test failed
EXIT_LAB_ERROR = 3  # no run failed, but the lab itself broke a run (not judged)
EXIT_UNTESTED = 4  # every run judged ok, but the campaign tested less than it planned


@dataclass(frozen=True)
class Tally:
    """What a campaign's records planned and what landed."""

    runs: int
    planned_kills: int
    kills: int
    #: Faults planned at failpoints (kills, pauses, stops), and those that landed there.
    planned_at_failpoints: int
    at_failpoints: int
    #: Of the planned ones, those whose attempt's trace reached their point's n-th hit.
    reached_at_failpoints: int
    #: Attempt traces the records kept, and how many failpoint hits they counted in all.
    traces: int
    trace_hits: int
    #: Runs whose schedule planned a kill and that recorded none (their ids).
    runs_without_kill: tuple[str, ...]


def _schedule(record: RunRecord) -> Schedule | None:
    if record.schedule is None:
        return None
    try:
        return Schedule.from_json(record.schedule)
    except (KeyError, TypeError, ValueError):
        return None  # a record's schedule is data from outside: unreadable plans nothing


def planned_kills(record: RunRecord) -> int:
    """Driver kills the run's schedule asked for (``Schedule.planned_kills``)."""
    s = _schedule(record)
    return 0 if s is None else s.planned_kills


def _at_points(record: RunRecord) -> int:
    """Faults of the run's realized interleaving that met their point (a stop at a
    failpoint: ``campaigns/inject.py``), landed or not; timed and triggered ones are not."""
    steps = record.extra.get("interleaving")
    if not isinstance(steps, list):
        return 0
    n = 0
    for step in steps:
        at = step.get("at") if isinstance(step, dict) else None
        if isinstance(at, dict) and "point" in at and "after_s" not in at:
            n += step.get("type") in ("ok", "info", "fail")
    return n


def _stories(record: RunRecord) -> dict[int, dict[str, int]] | None:
    """Each traced attempt's hits per point (``coverage.attempt_story``), by attempt
    index; None when the record kept no trace. Malformed entries count nothing."""
    stories = record.extra.get("trace")
    if not isinstance(stories, list):
        return None
    out: dict[int, dict[str, int]] = {}
    for st in stories:
        if not isinstance(st, dict) or not isinstance(st.get("attempt"), int):
            continue
        hits = st.get("hits")
        if isinstance(hits, dict):
            out[st["attempt"]] = {
                k: v for k, v in hits.items() if isinstance(k, str) and isinstance(v, int)
            }
    return out


def _points(a: AttemptPlan, *, kills: bool = False) -> list[tuple[str, int]]:
    """The (point, n) an attempt's faults at failpoints and points wait for (``kills``:
    only those that kill its driver)."""
    out = []
    if a.failpoint is not None and (not kills or a.failpoint.action == "kill"):
        out.append((a.failpoint.name, a.failpoint.n))
    out += [(ap.point, ap.n) for ap in a.at_points if not kills or ap.kind == "kill"]
    return out


def _had_chance(
    stories: dict[int, dict[str, int]] | None, attempts: int, i: int, point: str, n: int
) -> bool:
    """Attempt ``i``'s trace reached ``point``'s n-th hit; without traces, it ran."""
    if stories is None:
        return i < max(attempts, 1)
    return _reached(stories.get(i), point, n)


def _reached(hits: dict[str, int] | None, point: str, n: int) -> bool:
    if hits is None:
        return False  # the attempt never ran
    seen = sum(hits.values()) if point == "*" else hits.get(point, 0)
    return seen >= n


def _some_kill_reachable(
    s: Schedule, stories: dict[int, dict[str, int]] | None, attempts: int
) -> bool:
    """Whether one of the schedule's kills had its chance: a random-time kill always does
    (no trace can say otherwise); a kill at a failpoint or a point when its attempt ran
    and its trace reached the point's n-th hit (without a trace, when its attempt ran).
    How many times a point is hit can vary from run to run (a point passed while a
    command is polled), so an exhaustive run may end before the hit it was planned at."""
    for i, a in enumerate(s.attempts):
        if a.kill_after_s:
            return True
        if any(_had_chance(stories, attempts, i, pt, n) for pt, n in _points(a, kills=True)):
            return True
    return False


def tally(records: Iterable[RunRecord]) -> Tally:
    rs = list(records)
    planned = at_planned = at_landed = at_reached = traces = trace_hits = 0
    without: list[str] = []
    for r in rs:
        s = _schedule(r)
        if s is None:
            continue
        p = s.planned_kills
        planned += p
        stories = _stories(r)
        if stories is not None:
            traces += len(stories)
            trace_hits += sum(sum(h.values()) for h in stories.values())
        for i, a in enumerate(s.attempts):
            faults = _points(a)
            at_planned += len(faults)
            at_reached += sum(_had_chance(stories, r.attempts, i, pt, n) for pt, n in faults)
        at_landed += r.faults.get("failpoint", 0) + _at_points(r)
        if p and not r.kills and _some_kill_reachable(s, stories, r.attempts):
            without.append(r.run_id)
    return Tally(
        runs=len(rs),
        planned_kills=planned,
        kills=sum(r.kills for r in rs),
        planned_at_failpoints=at_planned,
        at_failpoints=at_landed,
        reached_at_failpoints=at_reached,
        traces=traces,
        trace_hits=trace_hits,
        runs_without_kill=tuple(without),
    )


def shortfall(records: Iterable[RunRecord], tolerance: Tolerance) -> str | None:
    """None when the campaign was tested as planned, else why not (one line).

    ``records`` are the campaign's run records (each with its ``schedule``, ``kills``
    and ``faults``), every run's: a ``lab_error`` run's kills count as what they were.
    """
    t = tally(records)
    if t.runs == 0:
        return "ran no run"
    if t.planned_kills:
        need = max(1, math.ceil(tolerance.min_kill_fraction * t.planned_kills))
        if t.kills < need:
            return (
                f"kills={t.kills} of planned_kills={t.planned_kills}: fewer than the "
                f"{need} (at least {tolerance.min_kill_fraction:.0%}) this scenario must land"
            )
    if tolerance.at_failpoints and t.planned_at_failpoints and not t.at_failpoints:
        if t.traces and not t.trace_hits:
            return (
                f"none of the {t.planned_at_failpoints} faults planned at failpoints landed "
                f"and the {t.traces} attempts' traces count no failpoint hit (are the "
                "failpoints armed?)"
            )
        if t.reached_at_failpoints:
            return (
                f"none of the {t.planned_at_failpoints} faults planned at failpoints landed, "
                f"{t.reached_at_failpoints} of them at a hit the trace saw (are the "
                "failpoints armed and hit?)"
            )
    if tolerance.kill_every_run and t.runs_without_kill:
        ids = ", ".join(t.runs_without_kill[:5]) + (", ..." * (len(t.runs_without_kill) > 5))
        return (
            f"{len(t.runs_without_kill)} of {t.runs} runs landed none of their planned "
            f"kills ({ids}); this scenario must land one in every run"
        )
    return None


def campaign_shortfall(records: Iterable[RunRecord], spec: CampaignSpec) -> str | None:
    """``shortfall`` with the tolerance the spec's scenario states."""
    return shortfall(records, spec.tolerance)


def exit_code(records: Iterable[RunRecord], untested: str | None) -> int:
    """1 if a run failed, else 3 if the lab broke one, else 4 if ``untested``, else 0."""
    outcomes = {r.outcome for r in records}
    if "failed" in outcomes:
        return EXIT_FAILED
    if "lab_error" in outcomes:
        return EXIT_LAB_ERROR
    return EXIT_OK if untested is None else EXIT_UNTESTED


__all__ = [
    "EXIT_FAILED",
    "EXIT_LAB_ERROR",
    "EXIT_OK",
    "EXIT_UNTESTED",
    "Tally",
    "Tolerance",
    "campaign_shortfall",
    "exit_code",
    "planned_kills",
    "shortfall",
    "tally",
]
