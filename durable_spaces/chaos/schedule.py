"""Fault schedules: what goes wrong in one run, drawn from the run's seed.

A schedule is data (JSON round-trip), so a failing run's schedule can be saved, shrunk and
replayed without the seed. It is drawn once per run from ``random.Random(seed)`` (seed
strings look like ``"<seed_base>-<run_index>"``), attempt by attempt, from the records of
``chaos/faults.py`` with a ``chaos/profiles.py`` profile: a failpoint (kill or pause), a
random-time kill, pauses and Space faults at logical points of the run (or on a trigger).

Only the first ``profile.faulty_attempts`` attempts carry faults; later attempts are
clean, so every run can finish and be checked. ``exhaustive`` builds the systematic
alternative: one schedule per ``(point, n)`` hit seen in an uninterrupted run's trace.
``Schedule.exact`` turns what a run really went through (its realized interleaving) back
into a schedule that replays it.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_spaces.chaos import points
from durable_spaces.chaos.failpoints import ANY
from durable_spaces.chaos.faults import (
    FAULT_KINDS,
    PAUSE_POINTS,
    POINT_KINDS,
    TRIGGERS,
    AttemptPlan,
    DriverPause,
    Failpoint,
    PointFault,
    SpaceFault,
)
from durable_spaces.chaos.points import ADAPTER_SPAWN
from durable_spaces.chaos.profiles import PROFILES, Profile, profile_named
from durable_spaces.host.bounded import load_json, parse_json, read_text

#: Schedules are a few KB; a bigger (or endless, /dev/zero) file is not one.
MAX_SCHEDULE_BYTES = 16 << 20
#: A failpoint trace has a line per hit: a run's are thousands of lines, not millions.
MAX_TRACE_BYTES = 64 << 20

#: Points hit only from a timer (whether they are hit depends on timing): never a
#: logical position for a drawn fault.
TIMER_DRIVEN = points.TIMER_ONLY
#: Points a run passes a number of times that depends on timing: never a failpoint of a
#: profile with ``fixed_failpoints``.
TIMED = points.TIMED
#: About how many logical hits one scripted call makes (measured: ~24, counting the log's
#: commits): the range ``*`` positions are drawn from, a run's whole logical timeline.
LOGICAL_HITS_PER_CALL = 20
#: Named points every call passes, whatever its tool and mode: named positions are drawn
#: among these so that a drawn fault lands (recovery-only points rarely exist).
EVERY_CALL = (
    points.ADAPTER_CALL,
    points.ADAPTER_START_MARK,
    points.ADAPTER_OUTCOME_COMMIT,
    points.HARNESS_INTENT,
    points.HARNESS_TOOL_RETURNED,
    points.HARNESS_TOOL_RESULT,
)


#: Fault kinds added after seeds were first drawn: where a profile leaves them off they
#: draw nothing, so an old seed still draws the schedule it drew.
LATER_KINDS = ("space_pause", "power_loss", "disk_stall", "journal_kill", "log_loss")


@dataclass(frozen=True)
class Schedule:
    """Per-attempt plans of one run; attempts past the list are clean."""

    seed: str
    attempts: tuple[AttemptPlan, ...] = ()
    #: How the schedule was made: "drawn", "exhaustive", "shrunk", "manual".
    origin: str = "drawn"

    def plan(self, attempt: int) -> AttemptPlan:
        """The plan of attempt ``attempt`` (0-based); empty past the end."""
        return self.attempts[attempt] if 0 <= attempt < len(self.attempts) else AttemptPlan()

    @property
    def planned_kills(self) -> int:
        """Driver kills the schedule asks for (each may or may not land): failpoints whose
        action is a kill (a pause failpoint stops its driver, it does not kill it), random
        times, kills at points."""
        return (
            sum(
                len(a.kill_after_s) + sum(1 for p in a.at_points if p.kind == "kill")
                for a in self.attempts
            )
            + self.planned_failpoint_kills
        )

    @property
    def planned_failpoint_kills(self) -> int:
        """The attempts whose failpoint kills its driver."""
        return sum(
            1 for a in self.attempts if a.failpoint is not None and a.failpoint.action == "kill"
        )

    def planned_faults(self) -> dict[str, int]:
        c: Counter[str] = Counter(f.kind for a in self.attempts for f in a.faults)
        c.update(p.kind for a in self.attempts for p in a.at_points if p.kind != "kill")
        return dict(sorted(c.items()))

    def size(self) -> tuple[int, int, float]:
        """Shrink order: (faults + kills, sum of failpoint hit numbers, sum of delays)."""
        n = self.planned_kills + sum(
            len(a.faults)
            + sum(1 for p in a.at_points if p.kind != "kill")
            + (a.failpoint is not None and a.failpoint.action != "kill")  # a pause failpoint
            for a in self.attempts
        )
        hits = sum(a.failpoint.n for a in self.attempts if a.failpoint is not None)
        hits += sum(p.n for a in self.attempts for p in a.at_points)
        delays = sum(sum(a.kill_after_s) for a in self.attempts) + sum(
            f.at_s or 0.0 for a in self.attempts for f in a.faults
        )
        return (n, hits, delays)

    def trimmed(self) -> Schedule:
        """Without trailing empty attempts (same meaning, smaller JSON)."""
        plans = list(self.attempts)
        while plans and plans[-1].empty:
            plans.pop()
        return Schedule(self.seed, tuple(plans), self.origin)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "origin": self.origin,
            "attempts": [a.to_json() for a in self.attempts],
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Schedule:
        return Schedule(
            seed=str(d["seed"]),
            attempts=tuple(AttemptPlan.from_json(a) for a in d.get("attempts", ())),
            origin=str(d.get("origin", "drawn")),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @staticmethod
    def loads(text: str) -> Schedule:
        return Schedule.from_json(parse_json(text, where="a schedule"))

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        return p

    @staticmethod
    def load(path: str | Path) -> Schedule:
        return Schedule.from_json(load_json(path, max_bytes=MAX_SCHEDULE_BYTES))

    @staticmethod
    def draw(
        seed: str,
        points: Sequence[str],
        calls: int,
        profile: Profile | str = "default",
    ) -> Schedule:
        """Draw a schedule from ``seed`` alone (same arguments, same schedule, any machine).

        ``points`` are the failpoint names the driver passes (each hit about once per
        call, so ``n`` is drawn in ``1..calls``); ``calls`` is the scripted call count.
        Pauses and Space faults land at logical points (a named point's n-th hit, or the
        run's n-th logical hit) unless the profile places them in time.
        """
        prof = profile_named(profile) if isinstance(profile, str) else profile
        rng = random.Random(seed)
        pts = sorted(points)  # order of the caller's list must not change the draw
        logical = [p for p in pts if p in EVERY_CALL] or [p for p in pts if p not in TIMER_DRIVEN]
        fps = [p for p in pts if p not in TIMED] if prof.fixed_failpoints else pts
        timed = prof.placement == "timed"

        def position() -> tuple[str, int]:
            if rng.random() < 0.5:
                return rng.choice(logical), rng.randint(1, max(1, calls))
            return ANY, rng.randint(1, max(1, calls * LOGICAL_HITS_PER_CALL))

        plans: list[AttemptPlan] = []
        cut_soon = False  # the last attempt's stall was taken over: a cut while it holds
        # Every draw below is guarded so a probability of 0 consumes no randomness.
        for _ in range(prof.faulty_attempts):
            fp = None
            pauses: list[DriverPause] = []
            at_points: list[PointFault] = []
            if fps and rng.random() < prof.p_failpoint:
                fp = Failpoint(rng.choice(fps), rng.randint(1, max(1, calls)))
                if prof.p_pause_failpoint and rng.random() < prof.p_pause_failpoint:
                    ppts = sorted(PAUSE_POINTS)
                    fp = Failpoint(rng.choice(ppts), rng.randint(1, max(1, calls)), "pause")
                    pauses.append(DriverPause(None, round(rng.uniform(*prof.resume_s), 3)))
            kills: tuple[float, ...] = ()
            if rng.random() < prof.p_random_kill:
                kills = (round(rng.uniform(*prof.kill_delay_s), 3),)
            if prof.p_pause and rng.random() < prof.p_pause:
                at_s = round(rng.uniform(*prof.kill_delay_s), 3)
                resume = round(rng.uniform(*prof.resume_s), 3)
                takeover = rng.random() < prof.p_takeover
                if timed:
                    pauses.append(DriverPause(at_s, resume, takeover))
                else:
                    at_points.append(PointFault(*position(), "pause", None, resume, takeover))
            faults: list[SpaceFault] = []
            if cut_soon:  # timed: the next driver cannot reach a point while it waits
                faults.append(SpaceFault("power_loss", at_s=round(rng.uniform(0.1, 0.8), 3)))
            cut_soon = False
            for kind in FAULT_KINDS:
                p_kind = prof.p_fault(kind)
                if kind in LATER_KINDS and not p_kind:
                    continue  # kinds added later draw nothing where they are off
                if kind == "disk_stall":
                    if rng.random() < p_kind:
                        stall = _draw_stall(rng, prof)
                        if timed:
                            at = round(rng.uniform(*prof.fault_delay_s), 3)
                            faults.append(SpaceFault(kind, at_s=at, **stall))
                        elif rng.random() < 0.5:  # a Space mutation ahead: a ledger append
                            pp = rng.choice(sorted(PAUSE_POINTS)), rng.randint(1, max(1, calls))
                            at_points.append(PointFault(*pp, kind, **stall))
                        else:  # anywhere: mostly a log commit next
                            at_points.append(PointFault(*position(), kind, **stall))
                        if stall["takeover"] and prof.p_cut_in_stall:
                            cut_soon = rng.random() < prof.p_cut_in_stall
                    continue
                if rng.random() < p_kind:
                    dur = (
                        round(rng.uniform(*prof.space_pause_s), 3)
                        if kind == "space_pause"
                        else None
                    )
                    if rng.random() < prof.p_after_kill and (fp is not None or kills):
                        faults.append(SpaceFault(kind, trigger="after_kill", duration_s=dur))
                    elif timed:
                        at = round(rng.uniform(*prof.fault_delay_s), 3)
                        faults.append(SpaceFault(kind, at_s=at, duration_s=dur))
                    elif kind == "journal_kill" and rng.random() < 0.5:
                        # while a command runs: its changes made before or after the
                        # helper died, the call's end scan the first to find it gone
                        n = rng.randint(1, max(1, calls))
                        at_points.append(PointFault(ADAPTER_SPAWN, n, kind))
                    else:
                        at_points.append(PointFault(*position(), kind, dur))
            plans.append(AttemptPlan(fp, kills, tuple(faults), tuple(pauses), tuple(at_points)))
        return Schedule(seed, tuple(plans), "drawn").trimmed()

    @staticmethod
    def exact(seed: str, drawn: Schedule, realized: Sequence[Mapping[str, Any]]) -> Schedule:
        """The schedule that replays a run's realized interleaving: every fault that landed
        goes where it landed (a timed one at the last point its driver had passed), the
        attempts' own failpoints and triggered faults stay, and nothing that did not land
        is planned. See ``campaigns/inject.py`` for the realized records."""
        per: dict[int, list[PointFault]] = {}
        after: dict[int, list[SpaceFault]] = {}
        for r in realized:
            if r.get("type") not in ("ok", "info"):
                continue  # cancelled, or failed to land: not part of what happened
            i, kind, at = int(r["attempt"]), str(r["kind"]), r.get("at") or {}
            value = r.get("value") or {}
            dur = value.get("duration_s")
            dur = None if dur is None else float(dur)
            if "trigger" in at:
                trig = str(at["trigger"])
                after.setdefault(i, []).append(SpaceFault(kind, trigger=trig, duration_s=dur))
                continue
            point = at.get("point")
            if point is None and kind == "disk_stall":
                point, at = ANY, {"n": 1}  # before its first hit: at the first (no trigger)
            if point is None:  # landed before the driver's first hit: right at its launch
                if kind in FAULT_KINDS:
                    after.setdefault(i, []).append(
                        SpaceFault(kind, trigger="at_launch", duration_s=dur)
                    )
                continue
            per.setdefault(i, []).append(
                PointFault(
                    str(point),
                    int(at["n"]),
                    kind,
                    dur,
                    float(value.get("resume_s", 0.0)),
                    bool(value.get("takeover", True)),
                )
            )
        n = max([len(drawn.attempts), *(k + 1 for k in per), *(k + 1 for k in after)])
        plans = []
        for i in range(n):
            base = drawn.plan(i)
            pauses = tuple(p for p in base.pauses if p.at_s is None)  # the failpoint's own
            plans.append(
                AttemptPlan(
                    failpoint=base.failpoint,
                    faults=tuple(after.get(i, ())),
                    pauses=pauses,
                    at_points=tuple(per.get(i, ())),
                )
            )
        return Schedule(seed, tuple(plans), "exact").trimmed()


def _draw_stall(rng: random.Random, prof: Profile) -> dict[str, Any]:
    """A disk stall's length, when the disk comes back after a takeover, and whether
    there is one."""
    return {
        "duration_s": round(rng.uniform(*prof.disk_stall_s), 3),
        "resume_s": round(rng.uniform(*prof.resume_s), 3),
        "takeover": rng.random() < prof.p_takeover,
    }


def read_trace(source: str | Path | Iterable[str]) -> list[tuple[str, int]]:
    """Hits from a ``DS_FAILPOINT_TRACE`` file (lines ``"point n"``), in order, unique."""
    if isinstance(source, str | Path):
        source = read_text(source, max_bytes=MAX_TRACE_BYTES, errors="replace").splitlines()
    lines = source
    seen: dict[tuple[str, int], None] = {}
    for line in lines:
        parts = line.split()
        if len(parts) not in (2, 3, 5) or not parts[1].isdigit():
            continue  # a torn last line of a killed writer
        seen.setdefault((parts[0], int(parts[1])), None)
    return list(seen)


def exhaustive(trace: str | Path | Iterable[str], seed_base: str = "exhaustive") -> list[Schedule]:
    """One single-kill schedule per ``(point, n)`` hit of an uninterrupted run's trace."""
    return [
        Schedule(
            f"{seed_base}-{point}-{n}",
            (AttemptPlan(failpoint=Failpoint(point, n)),),
            "exhaustive",
        )
        for point, n in read_trace(trace)
    ]


__all__ = [
    "FAULT_KINDS",
    "PAUSE_POINTS",
    "POINT_KINDS",
    "PROFILES",
    "TRIGGERS",
    "AttemptPlan",
    "DriverPause",
    "Failpoint",
    "PointFault",
    "Profile",
    "Schedule",
    "SpaceFault",
    "exhaustive",
    "profile_named",
    "read_trace",
]
