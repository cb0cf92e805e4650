"""Shrinking a failing run to a smaller one that still fails.

Hypothesis's shape: a list of named passes, each proposing smaller variants of the
current failing ``RunSpec``; the first variant that still fails replaces it; the passes
are run again, round after round, until a whole round makes no progress (or the budget
of predicate calls runs out). Every pass is counted (tried / accepted) so a report can
say which ones did the work.

Rules every pass keeps:

- A candidate is strictly smaller than the current spec in the order ``(calls,
  schedule.size())``: fewer calls first, then fewer faults and kills, then earlier
  failpoint hits, then shorter delays. Nothing is ever added, so shrinking terminates.
- Only ``still_fails(candidate)`` decides; a candidate that errors in some other way
  should make it return False (a different bug is not this one).
- Deterministic: the same failing spec and predicate give the same result.
- A spec without an explicit schedule (drawn from the seed) only shrinks its calls;
  give it the schedule the run recorded to shrink faults too, because a redraw with
  fewer calls would be a different schedule.

Passes: ``drop_fault`` (a Space fault, a pause or a fault at a point), ``drop_kill`` (a
failpoint, a random-time kill or a kill at a point), ``halve_calls``, ``drop_call`` (one
call fewer), ``kill_earlier`` (a failpoint or point fault at an earlier hit, a random
kill after half the delay).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.chaos.schedule import AttemptPlan, Failpoint, Schedule

Pass = Callable[[RunSpec], Iterator[RunSpec]]


def _sched(spec: RunSpec, plans: list[AttemptPlan]) -> RunSpec:
    assert spec.schedule is not None
    s = Schedule(spec.schedule.seed, tuple(plans), "shrunk").trimmed()
    return spec.with_(schedule=s)


def drop_fault(spec: RunSpec) -> Iterator[RunSpec]:
    if spec.schedule is None:
        return
    plans = list(spec.schedule.attempts)
    for i, plan in enumerate(plans):
        for j in range(len(plan.faults)):
            faults = plan.faults[:j] + plan.faults[j + 1 :]
            yield _sched(spec, [*plans[:i], replace(plan, faults=faults), *plans[i + 1 :]])
        for j in range(len(plan.pauses)):
            pauses = plan.pauses[:j] + plan.pauses[j + 1 :]
            yield _sched(spec, [*plans[:i], replace(plan, pauses=pauses), *plans[i + 1 :]])
        for j, pf in enumerate(plan.at_points):
            if pf.kind != "kill":
                pts = plan.at_points[:j] + plan.at_points[j + 1 :]
                yield _sched(spec, [*plans[:i], replace(plan, at_points=pts), *plans[i + 1 :]])


def drop_kill(spec: RunSpec) -> Iterator[RunSpec]:
    if spec.schedule is None:
        return
    plans = list(spec.schedule.attempts)
    for i, plan in enumerate(plans):
        if plan.failpoint is not None:
            yield _sched(spec, [*plans[:i], replace(plan, failpoint=None), *plans[i + 1 :]])
        for j in range(len(plan.kill_after_s)):
            kills = plan.kill_after_s[:j] + plan.kill_after_s[j + 1 :]
            yield _sched(spec, [*plans[:i], replace(plan, kill_after_s=kills), *plans[i + 1 :]])
        for j, pf in enumerate(plan.at_points):
            if pf.kind == "kill":
                pts = plan.at_points[:j] + plan.at_points[j + 1 :]
                yield _sched(spec, [*plans[:i], replace(plan, at_points=pts), *plans[i + 1 :]])


def halve_calls(spec: RunSpec) -> Iterator[RunSpec]:
    if spec.calls > 1:
        yield spec.with_(calls=max(1, spec.calls // 2))


def drop_call(spec: RunSpec) -> Iterator[RunSpec]:
    if spec.calls > 1:
        yield spec.with_(calls=spec.calls - 1)


def kill_earlier(spec: RunSpec) -> Iterator[RunSpec]:
    if spec.schedule is None:
        return
    plans = list(spec.schedule.attempts)
    for i, plan in enumerate(plans):
        fp = plan.failpoint
        if fp is not None and fp.n > 1:
            for n in dict.fromkeys((1, fp.n // 2, fp.n - 1)):
                if 1 <= n < fp.n:
                    moved = replace(plan, failpoint=Failpoint(fp.name, n, fp.action))
                    yield _sched(spec, [*plans[:i], moved, *plans[i + 1 :]])
        for j, pf in enumerate(plan.at_points):
            for n in dict.fromkeys((1, pf.n // 2, pf.n - 1)):
                if 1 <= n < pf.n:
                    pts = (*plan.at_points[:j], replace(pf, n=n), *plan.at_points[j + 1 :])
                    yield _sched(spec, [*plans[:i], replace(plan, at_points=pts), *plans[i + 1 :]])
        for j, d in enumerate(plan.kill_after_s):
            if d > 0.02:
                kills = (*plan.kill_after_s[:j], round(d / 2, 3), *plan.kill_after_s[j + 1 :])
                yield _sched(spec, [*plans[:i], replace(plan, kill_after_s=kills), *plans[i + 1 :]])


PASSES: dict[str, Pass] = {
    "drop_fault": drop_fault,
    "drop_kill": drop_kill,
    "halve_calls": halve_calls,
    "drop_call": drop_call,
    "kill_earlier": kill_earlier,
}


def size(spec: RunSpec) -> tuple[int, tuple[int, int, float]]:
    """The order shrinking descends."""
    return (spec.calls, spec.schedule.size() if spec.schedule else (0, 0, 0.0))


@dataclass
class ShrinkResult:
    spec: RunSpec
    original: RunSpec
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    calls: int = 0
    rounds: int = 0
    budget_exhausted: bool = False

    @property
    def shrunk(self) -> bool:
        return size(self.spec) < size(self.original)


def shrink(
    spec: RunSpec,
    still_fails: Callable[[RunSpec], bool],
    *,
    max_calls: int = 200,
    passes: dict[str, Pass] | None = None,
) -> ShrinkResult:
    """The smallest failing spec the passes reach (``spec`` itself must fail)."""
    passes = PASSES if passes is None else passes
    result = ShrinkResult(spec, spec, {n: {"tried": 0, "accepted": 0} for n in passes})
    current = spec
    progress = True
    while progress:
        progress = False
        result.rounds += 1
        for name, p in passes.items():
            # one pass keeps going on its own successes before the next pass runs
            improved = True
            while improved:
                improved = False
                for cand in p(current):
                    if size(cand) >= size(current):
                        continue
                    if result.calls >= max_calls:
                        result.budget_exhausted = True
                        result.spec = current
                        return result
                    result.calls += 1
                    result.stats[name]["tried"] += 1
                    if still_fails(cand):
                        result.stats[name]["accepted"] += 1
                        current = cand
                        improved = progress = True
                        break
    result.spec = current
    return result
