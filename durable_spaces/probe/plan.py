"""Which runs a probe makes: the uninterrupted run, then one fault per run.

Run ``r0`` goes through the task with no fault: it tells which points this harness
reaches (not every harness streams; a write step has no command) and whether it can be
probed at all. Then ``exhaustive`` plans one run per reached point a fault applies to,
and ``random`` draws each run's point from them with the run's own seed, so the same seed
base plans the same runs. Model faults apply where they can: an HTTP 5xx and a slow answer
at a request, a cut partway through an answer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from durable_spaces.probe.faults import KILL_FAULTS
from durable_spaces.probe.gates import GatePoint

__all__ = ["SCENARIOS", "applicable", "draw", "run_seed"]

SCENARIOS = ("random", "exhaustive")


def run_seed(seed_base: str, i: int) -> str:
    return f"{seed_base}-{i}"


def applicable(points: Sequence[GatePoint], fault: str, at: Sequence[str] = ()) -> list[GatePoint]:
    """The reached points where ``fault`` can be put (only the kinds ``at`` names, when
    it names any)."""
    if fault in KILL_FAULTS:
        fits = list(points)
    else:
        where = "stream" if fault == "model-cut" else "request"
        fits = [p for p in points if p.where == where]
    return sorted(p for p in fits if not at or p.where in at)


def draw(points: Sequence[GatePoint], scenario: str, runs: int, seed_base: str) -> list[GatePoint]:
    """The planned point of runs r1, r2, ...: every point once (``exhaustive``), or
    ``runs`` points drawn, each from its run's seed (``random``)."""
    if scenario == "exhaustive" or not points:
        return sorted(points)
    return [random.Random(run_seed(seed_base, i)).choice(sorted(points))
            for i in range(1, runs + 1)]  # fmt: skip
