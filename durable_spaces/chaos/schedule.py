"""Fault schedules: what goes wrong in one run, drawn from the run's seed.

A schedule is data (JSON round-trip), so a failing run's schedule can be saved, shrunk and
replayed without the seed. It is drawn once per run from ``random.Random(seed)`` (seed
strings look like ``"<seed_base>-<run_index>"``), attempt by attempt:

- an optional failpoint to arm in that attempt's driver (``DS_FAILPOINTS="name:n"``);
- random-time SIGKILLs of the driver by the runner (delays from the attempt's launch);
- Space faults (``daemon_kill``, ``space_restart``, ``space_remove``) at a time after the
  launch or on a trigger (``"after_kill"``: right after this attempt's driver died, before
  the next one is placed).

Only the first ``profile.faulty_attempts`` attempts carry faults; later attempts are
clean, so every run can finish and be checked. ``exhaustive`` builds the systematic
alternative: one schedule per ``(point, n)`` hit seen in an uninterrupted run's trace.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_spaces.errors import ConfigError

#: Space faults a schedule can carry (the driver kill is "kill", counted separately).
FAULT_KINDS = ("daemon_kill", "space_restart", "space_remove")
#: Triggers a Space fault may wait for instead of a time.
TRIGGERS = ("after_kill",)


@dataclass(frozen=True)
class Failpoint:
    """Kill the driver at the ``n``-th hit of ``name`` (1-based)."""

    name: str
    n: int = 1

    def spec(self) -> str:
        """The ``DS_FAILPOINTS`` form."""
        return f"{self.name}:{self.n}"


@dataclass(frozen=True)
class SpaceFault:
    """A fault of the Space: at ``at_s`` seconds after the attempt's launch, or on ``trigger``."""

    kind: str
    at_s: float | None = None
    trigger: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown Space fault kind {self.kind!r}")
        if (self.at_s is None) == (self.trigger is None):
            raise ValueError("a Space fault needs exactly one of at_s and trigger")
        if self.trigger is not None and self.trigger not in TRIGGERS:
            raise ValueError(f"unknown trigger {self.trigger!r}")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.at_s is not None:
            d["at_s"] = self.at_s
        else:
            d["trigger"] = self.trigger
        return d


@dataclass(frozen=True)
class AttemptPlan:
    """What goes wrong during one drive attempt (index 0 is the first driver)."""

    failpoint: Failpoint | None = None
    kill_after_s: tuple[float, ...] = ()
    faults: tuple[SpaceFault, ...] = ()

    @property
    def empty(self) -> bool:
        return self.failpoint is None and not self.kill_after_s and not self.faults

    def env(self) -> dict[str, str]:
        """Environment for the attempt's driver (arms its failpoint, or disarms)."""
        return {"DS_FAILPOINTS": self.failpoint.spec() if self.failpoint else ""}

    def to_json(self) -> dict[str, Any]:
        return {
            "failpoint": None
            if self.failpoint is None
            else {"name": self.failpoint.name, "n": self.failpoint.n},
            "kill_after_s": list(self.kill_after_s),
            "faults": [f.to_json() for f in self.faults],
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> AttemptPlan:
        fp = d.get("failpoint")
        return AttemptPlan(
            failpoint=None if fp is None else Failpoint(str(fp["name"]), int(fp["n"])),
            kill_after_s=tuple(float(x) for x in d.get("kill_after_s", ())),
            faults=tuple(
                SpaceFault(str(f["kind"]), f.get("at_s"), f.get("trigger"))
                for f in d.get("faults", ())
            ),
        )


@dataclass(frozen=True)
class Profile:
    """Probabilities and ranges a schedule is drawn with (per faulty attempt)."""

    p_failpoint: float = 0.6
    p_random_kill: float = 0.3
    kill_delay_s: tuple[float, float] = (0.05, 1.5)
    p_daemon_kill: float = 0.1
    p_space_restart: float = 0.1
    p_space_remove: float = 0.05
    #: Probability that a drawn Space fault waits for the driver kill instead of a time.
    p_after_kill: float = 0.5
    fault_delay_s: tuple[float, float] = (0.05, 1.5)
    #: Attempts that may carry faults; later ones are clean so the run can finish.
    faulty_attempts: int = 4

    def p_fault(self, kind: str) -> float:
        return {
            "daemon_kill": self.p_daemon_kill,
            "space_restart": self.p_space_restart,
            "space_remove": self.p_space_remove,
        }[kind]


#: Named profiles (``CampaignSpec.profile``).
PROFILES: dict[str, Profile] = {
    "default": Profile(),
    # driver kills only (failpoints and random times): the transactional/checkpoint core
    "kills": Profile(p_daemon_kill=0.0, p_space_restart=0.0, p_space_remove=0.0),
    # only failpoints, one per attempt: deterministic kill points
    "failpoints": Profile(
        p_failpoint=0.8,
        p_random_kill=0.0,
        p_daemon_kill=0.0,
        p_space_restart=0.0,
        p_space_remove=0.0,
    ),
    # Space faults more often (daemon kills, machine restarts, lost Spaces)
    "space": Profile(p_daemon_kill=0.3, p_space_restart=0.3, p_space_remove=0.2),
    # nothing goes wrong: a baseline run
    "calm": Profile(
        p_failpoint=0.0,
        p_random_kill=0.0,
        p_daemon_kill=0.0,
        p_space_restart=0.0,
        p_space_remove=0.0,
        faulty_attempts=0,
    ),
}


def profile_named(name: str) -> Profile:
    """The named profile; ``ConfigError`` naming the choices otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"unknown campaign profile {name!r} (choose from {', '.join(sorted(PROFILES))})"
        ) from None


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
        """Driver kills the schedule asks for (each may or may not land)."""
        return sum((a.failpoint is not None) + len(a.kill_after_s) for a in self.attempts)

    def planned_faults(self) -> dict[str, int]:
        c: Counter[str] = Counter(f.kind for a in self.attempts for f in a.faults)
        return dict(sorted(c.items()))

    def size(self) -> tuple[int, int, float]:
        """Shrink order: (faults + kills, sum of failpoint hit numbers, sum of delays)."""
        n = self.planned_kills + sum(len(a.faults) for a in self.attempts)
        hits = sum(a.failpoint.n for a in self.attempts if a.failpoint is not None)
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
        return Schedule.from_json(json.loads(text))

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        return p

    @staticmethod
    def load(path: str | Path) -> Schedule:
        return Schedule.loads(Path(path).read_text())

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
        """
        prof = profile_named(profile) if isinstance(profile, str) else profile
        rng = random.Random(seed)
        pts = sorted(points)  # order of the caller's list must not change the draw
        plans: list[AttemptPlan] = []
        for _ in range(prof.faulty_attempts):
            fp = None
            if pts and rng.random() < prof.p_failpoint:
                fp = Failpoint(rng.choice(pts), rng.randint(1, max(1, calls)))
            kills: tuple[float, ...] = ()
            if rng.random() < prof.p_random_kill:
                kills = (round(rng.uniform(*prof.kill_delay_s), 3),)
            faults: list[SpaceFault] = []
            for kind in FAULT_KINDS:
                if rng.random() < prof.p_fault(kind):
                    if rng.random() < prof.p_after_kill and (fp is not None or kills):
                        faults.append(SpaceFault(kind, trigger="after_kill"))
                    else:
                        faults.append(
                            SpaceFault(kind, at_s=round(rng.uniform(*prof.fault_delay_s), 3))
                        )
            plans.append(AttemptPlan(fp, kills, tuple(faults)))
        return Schedule(seed, tuple(plans), "drawn").trimmed()


def read_trace(source: str | Path | Iterable[str]) -> list[tuple[str, int]]:
    """Hits from a ``DS_FAILPOINT_TRACE`` file (lines ``"point n"``), in order, unique."""
    lines = Path(source).read_text().splitlines() if isinstance(source, str | Path) else source
    seen: dict[tuple[str, int], None] = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
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
