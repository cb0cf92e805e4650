"""What a run exercised: each attempt's story read from its failpoint trace.

Why: a green campaign says "nothing we looked at went wrong", not "every step of a call
was killed at least once". The trace every attempt writes (``DS_FAILPOINT_TRACE``: one
``point n g call t`` line per hit, ``chaos/failpoints.py``) says which points it passed,
in which wrapped call, when, and where it stopped; the run record keeps that story
(``extra.trace``), so a report can say which points were hit and killed at, which never
were, and draw a failed run's attempts on a timeline, from the record alone.

A record keeps at most ``MAX_CALLS`` calls an attempt: a story, not a copy of the trace.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_spaces.chaos.points import NOT_KILLABLE, REGISTRY
from durable_spaces.chaos.schedule import MAX_TRACE_BYTES
from durable_spaces.host.bounded import read_text

__all__ = [
    "MAX_CALLS",
    "Coverage",
    "KilledAt",
    "TraceHit",
    "attempt_stories",
    "attempt_story",
    "coverage_of",
    "killed_at",
    "read_hits",
    "registered_points",
]

MAX_CALLS = 200
_CALL = re.compile(r"[A-Za-z0-9_.:@-]{1,200}")
_STEP = re.compile(r"call-s(\d+)-")


@dataclass(frozen=True)
class TraceHit:
    point: str
    n: int
    call: str | None
    t_us: int | None


def read_hits(path: Path, limit: int = 100_000) -> list[TraceHit]:
    """The whole lines of a trace (a torn last line and malformed ones are skipped)."""
    try:
        text = read_text(path, max_bytes=MAX_TRACE_BYTES, errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return []
    hits: list[TraceHit] = []
    for line in text.split("\n")[:-1][:limit]:
        parts = line.split()
        if len(parts) not in (3, 5) or not parts[1].isdigit() or parts[0] not in REGISTRY:
            continue
        call = t = None
        if len(parts) == 5:
            call = parts[3] if parts[3] != "-" and _CALL.fullmatch(parts[3]) else None
            t = int(parts[4]) if parts[4].isdigit() else None
        hits.append(TraceHit(parts[0], int(parts[1]), call, t))
    return hits


def attempt_story(
    hits: Sequence[TraceHit], *, index: int, epoch: int | None, exit_code: int | None
) -> dict[str, Any]:
    """One attempt as the record keeps it: its hits per point, its calls (first and last
    hit, points passed), and the point where it ended."""
    calls: dict[str, dict[str, Any]] = {}
    for h in hits:
        if h.call is None:
            continue
        c = calls.get(h.call)
        if c is None:
            if len(calls) >= MAX_CALLS:
                continue
            c = calls[h.call] = {"call": h.call, "first_us": h.t_us, "points": []}
        c["last_us"] = h.t_us
        c["points"].append(h.point)
    last = hits[-1] if hits else None
    return {
        "attempt": index,
        "epoch": epoch,
        "exit_code": exit_code,
        "hits": dict(Counter(h.point for h in hits)),
        "first_us": next((h.t_us for h in hits if h.t_us is not None), None),
        "last_us": next((h.t_us for h in reversed(hits) if h.t_us is not None), None),
        "calls": list(calls.values()),
        "ended_at": None if last is None else {"point": last.point, "n": last.n, "call": last.call},
    }


def attempt_stories(
    attempts: int,
    epochs: Sequence[int],
    exit_codes: Sequence[int],
    trace_of: Callable[[int], Path | None],
) -> list[dict[str, Any]]:
    """Every attempt's story, from the trace file ``trace_of(index)`` names."""
    out = []
    for i in range(attempts):
        trace = trace_of(i)
        out.append(
            attempt_story(
                read_hits(trace) if trace is not None else [],
                index=i,
                epoch=epochs[i] if i < len(epochs) else None,
                exit_code=exit_codes[i] if i < len(exit_codes) else None,
            )
        )
    return out


def registered_points() -> list[str]:
    """Every logical failpoint (timer points are never a position a schedule can name)."""
    return sorted(name for name, p in REGISTRY.items() if not p.timer)


def call_kind(call: str | None) -> str:
    """``bash`` of ``bash:call-s3-ab12``; ``-`` outside a call."""
    return "-" if not call else call.split(":", 1)[0]


def call_step(call: str | None) -> int | None:
    """The scripted agent's step of a call id (``call-s3-...`` -> 3), if it has one."""
    m = _STEP.search(call or "")
    return int(m.group(1)) if m else None


@dataclass
class Coverage:
    """A campaign's points: hits and kills per (point, call kind) and per (point, step)."""

    hits: Counter[tuple[str, str]]
    kills: Counter[tuple[str, str]]
    kills_by_step: Counter[tuple[str, int]]
    #: Recoveries in the attempt after a kill, per killed point.
    recovered: Counter[str]
    registered: list[str]

    @property
    def hit_points(self) -> set[str]:
        return {p for p, _ in self.hits}

    @property
    def never_hit(self) -> list[str]:
        return [p for p in self.registered if p not in self.hit_points]

    def fraction(self) -> str:
        """``hit/registered`` for the SUMMARY line."""
        return f"{len(self.hit_points & set(self.registered))}/{len(self.registered)}"

    @property
    def killed_points(self) -> set[str]:
        return {p for p, _ in self.kills}

    def line(self) -> str:
        """The coverage line of a report: passed, killed at, and not killable (the
        registered points passed that ``chaos/points.py`` says a kill makes no sense at)."""
        passed = self.hit_points & set(self.registered)
        killed = self.killed_points & passed
        never = sorted(passed & set(NOT_KILLABLE))
        return (
            f"{len(passed)}/{len(self.registered)} registered failpoints passed; killed at "
            f"{len(killed)} of them ({sum(self.kills.values())} kills); not killable: "
            f"{', '.join(never) or 'none'}"
        )


@dataclass(frozen=True)
class KilledAt:
    """An exhaustive campaign's points against what its uninterrupted run passed."""

    #: The points the uninterrupted run passed, and how many times each.
    passed: dict[str, int]
    #: Of them, the points a kill landed at in some run.
    killed: frozenset[str]
    #: Of them, those a kill makes no sense at, and why (they had no run).
    not_killable: dict[str, str]

    @property
    def killable(self) -> set[str]:
        return set(self.passed) - set(self.not_killable)

    @property
    def missed(self) -> list[str]:
        """Killable points no kill landed at (an exhaustive campaign has none)."""
        return sorted(self.killable - self.killed)

    def fraction(self) -> str:
        """``killed at/killable`` for the SUMMARY line (``killed_at=``)."""
        return f"{len(self.killed & self.killable)}/{len(self.killable)}"

    def line(self) -> str:
        never = ", ".join(f"{p} ({why})" for p, why in sorted(self.not_killable.items()))
        missed = f"; never killed at: {', '.join(self.missed)}" if self.missed else ""
        return (
            f"the uninterrupted run passed {len(self.passed)} failpoints "
            f"({sum(self.passed.values())} hits); killed at "
            f"{len(self.killed & self.killable)} of them; not killable: {never or 'none'}"
            f"{missed}"
        )


def killed_at(cov: Coverage, plan: Any) -> KilledAt | None:
    """``plan`` (an exhaustive campaign's ``campaign.json`` ``exhaustive``, data read
    back: None unless it has the shape ``scenarios/exhaustive.py``'s ``plan_of`` gives)
    held against where the campaign's kills landed."""
    if not isinstance(plan, dict):
        return None
    passed, never = plan.get("passed"), plan.get("not_killable")
    if not isinstance(passed, dict) or not isinstance(never, dict):
        return None
    if not all(p in REGISTRY and type(n) is int and n > 0 for p, n in passed.items()):
        return None
    if not all(p in passed and isinstance(w, str) for p, w in never.items()):
        return None
    return KilledAt(dict(passed), frozenset(cov.killed_points & set(passed)), dict(never))


def _killed(story: dict[str, Any]) -> bool:
    return story.get("exit_code") == -9 and isinstance(story.get("ended_at"), dict)


def coverage_of(stories_per_run: Iterable[Sequence[dict[str, Any]]]) -> Coverage:
    """Coverage over every run's ``extra.trace`` (records without one add nothing)."""
    hits: Counter[tuple[str, str]] = Counter()
    kills: Counter[tuple[str, str]] = Counter()
    by_step: Counter[tuple[str, int]] = Counter()
    recovered: Counter[str] = Counter()
    for stories in stories_per_run:
        if not isinstance(stories, list):
            continue
        for i, s in enumerate(stories):
            if not isinstance(s, dict):
                continue
            kinds: dict[str, set[str]] = {}
            for c in s.get("calls") or []:
                for p in c.get("points") or []:
                    kinds.setdefault(p, set()).add(call_kind(c.get("call")))
            for p, n in (s.get("hits") or {}).items():
                if isinstance(n, int) and n > 0:
                    for kind in kinds.get(p, {"-"}):
                        hits[(p, kind)] += 1
            if not _killed(s):
                continue
            end = s["ended_at"]
            point, call = str(end.get("point")), end.get("call")
            kills[(point, call_kind(call))] += 1
            step = call_step(call)
            if step is not None:
                by_step[(point, step)] += 1
            nxt = stories[i + 1] if i + 1 < len(stories) else None
            if isinstance(nxt, dict) and any(
                str(p).startswith("recovery.") for p in (nxt.get("hits") or {})
            ):
                recovered[point] += 1
    return Coverage(hits, kills, by_step, recovered, registered_points())
