"""Fault schedules: what goes wrong in one run, drawn from the run's seed.

A schedule is data (JSON round-trip), so a failing run's schedule can be saved, shrunk and
replayed without the seed. It is drawn once per run from ``random.Random(seed)`` (seed
strings look like ``"<seed_base>-<run_index>"``), attempt by attempt:

- an optional failpoint to arm in that attempt's driver (``DS_FAILPOINTS="name:n"``), whose
  action is a kill or a pause (the driver stops itself there: SIGSTOP);
- random-time SIGKILLs of the driver by the runner (delays from the attempt's launch);
- driver pauses: SIGSTOP at a time (or the failpoint's own pause), optionally with a
  takeover (the coordinator gives up on the paused driver and launches the next epoch),
  and SIGCONT ``resume_s`` after the next driver's first step (or after the pause, without
  a takeover): the stale driver a kill can never make;
- Space faults (``daemon_kill``, ``space_restart``, ``space_remove``, ``space_pause``: the
  whole machine frozen for ``duration_s``) at a time after the launch or on a trigger
  (``"after_kill"``: right after this attempt's driver died, before the next one is
  placed).

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
FAULT_KINDS = ("daemon_kill", "space_restart", "space_remove", "space_pause")
#: Triggers a Space fault may wait for instead of a time.
TRIGGERS = ("after_kill",)
#: Failpoints where a driver is paused with a Space mutation ahead of it or in flight: a
#: continued stale driver would change the workspace there if the Space did not fence it.
PAUSE_POINTS = (
    "adapter.start_mark",
    "adapter.before_file_op",
    "adapter.spawn",
    "adapter.outcome_commit",
    "space.mutate",
    "space.mutate_started",
    "image.apply_op",
    "snapshots.restore",
    "recovery.start",
)


@dataclass(frozen=True)
class Failpoint:
    """Kill (or pause) the driver at the ``n``-th hit of ``name`` (1-based)."""

    name: str
    n: int = 1
    action: str = "kill"  # or "pause"

    def spec(self) -> str:
        """The ``DS_FAILPOINTS`` form."""
        return f"{self.name}:{self.n}" + ("" if self.action == "kill" else f":{self.action}")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "n": self.n}
        if self.action != "kill":
            d["action"] = self.action
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Failpoint:
        return Failpoint(str(d["name"]), int(d["n"]), str(d.get("action", "kill")))


@dataclass(frozen=True)
class DriverPause:
    """SIGSTOP the driver ``at_s`` after its launch (None: it stops itself at the
    attempt's pause failpoint), then SIGCONT: ``resume_s`` after the next driver's first
    step when ``takeover`` (the coordinator gives up on it meanwhile), else ``resume_s``
    after the pause."""

    at_s: float | None
    resume_s: float
    takeover: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"at_s": self.at_s, "resume_s": self.resume_s, "takeover": self.takeover}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> DriverPause:
        at = d.get("at_s")
        return DriverPause(
            None if at is None else float(at), float(d["resume_s"]), bool(d.get("takeover"))
        )


@dataclass(frozen=True)
class SpaceFault:
    """A fault of the Space: at ``at_s`` seconds after the attempt's launch, or on ``trigger``."""

    kind: str
    at_s: float | None = None
    trigger: str | None = None
    #: How long a ``space_pause`` keeps the machine frozen.
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown Space fault kind {self.kind!r}")
        if (self.kind == "space_pause") != (self.duration_s is not None):
            raise ValueError("a space_pause (and only it) needs duration_s")
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
        if self.duration_s is not None:
            d["duration_s"] = self.duration_s
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SpaceFault:
        dur = d.get("duration_s")
        return SpaceFault(
            str(d["kind"]), d.get("at_s"), d.get("trigger"), None if dur is None else float(dur)
        )


@dataclass(frozen=True)
class AttemptPlan:
    """What goes wrong during one drive attempt (index 0 is the first driver)."""

    failpoint: Failpoint | None = None
    kill_after_s: tuple[float, ...] = ()
    faults: tuple[SpaceFault, ...] = ()
    pauses: tuple[DriverPause, ...] = ()

    @property
    def empty(self) -> bool:
        return (
            self.failpoint is None and not self.kill_after_s and not self.faults and not self.pauses
        )

    def env(self) -> dict[str, str]:
        """Environment for the attempt's driver (arms its failpoint, or disarms)."""
        return {"DS_FAILPOINTS": self.failpoint.spec() if self.failpoint else ""}

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "failpoint": None if self.failpoint is None else self.failpoint.to_json(),
            "kill_after_s": list(self.kill_after_s),
            "faults": [f.to_json() for f in self.faults],
        }
        if self.pauses:
            d["pauses"] = [p.to_json() for p in self.pauses]
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> AttemptPlan:
        fp = d.get("failpoint")
        return AttemptPlan(
            failpoint=None if fp is None else Failpoint.from_json(fp),
            kill_after_s=tuple(float(x) for x in d.get("kill_after_s", ())),
            faults=tuple(SpaceFault.from_json(f) for f in d.get("faults", ())),
            pauses=tuple(DriverPause.from_json(p) for p in d.get("pauses", ())),
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
    #: A drawn failpoint pauses the driver there instead of killing it.
    p_pause_failpoint: float = 0.0
    #: A timed pause of the driver (SIGSTOP) in an attempt.
    p_pause: float = 0.0
    #: A pause comes with a takeover (the next epoch launched while it sleeps).
    p_takeover: float = 0.8
    #: SIGCONT this long after the next driver's first step (or after the pause).
    resume_s: tuple[float, float] = (0.0, 2.0)
    #: The whole Space frozen for a while.
    p_space_pause: float = 0.0
    space_pause_s: tuple[float, float] = (0.2, 2.0)

    def p_fault(self, kind: str) -> float:
        return {
            "daemon_kill": self.p_daemon_kill,
            "space_restart": self.p_space_restart,
            "space_remove": self.p_space_remove,
            "space_pause": self.p_space_pause,
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
    # Space faults more often (daemon kills, machine restarts, lost Spaces, frozen machines)
    "space": Profile(
        p_daemon_kill=0.3, p_space_restart=0.3, p_space_remove=0.2, p_space_pause=0.15
    ),
    # Paused drivers: at failpoints and at random times, most taken over while they sleep
    # and continued after the newer driver started (the stale writer), plus frozen Spaces.
    "pause": Profile(
        p_failpoint=0.7,
        p_pause_failpoint=0.6,
        p_random_kill=0.2,
        p_pause=0.4,
        p_daemon_kill=0.05,
        p_space_restart=0.05,
        p_space_remove=0.05,
        p_space_pause=0.2,
    ),
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
        # Every draw below is guarded so a probability of 0 consumes no randomness: the
        # profiles without pauses draw exactly the schedules they drew before pauses.
        for _ in range(prof.faulty_attempts):
            fp = None
            pauses: list[DriverPause] = []
            if pts and rng.random() < prof.p_failpoint:
                fp = Failpoint(rng.choice(pts), rng.randint(1, max(1, calls)))
                if prof.p_pause_failpoint and rng.random() < prof.p_pause_failpoint:
                    ppts = sorted(PAUSE_POINTS)
                    fp = Failpoint(rng.choice(ppts), rng.randint(1, max(1, calls)), "pause")
                    pauses.append(DriverPause(None, round(rng.uniform(*prof.resume_s), 3)))
            kills: tuple[float, ...] = ()
            if rng.random() < prof.p_random_kill:
                kills = (round(rng.uniform(*prof.kill_delay_s), 3),)
            if prof.p_pause and rng.random() < prof.p_pause:
                pauses.append(
                    DriverPause(
                        round(rng.uniform(*prof.kill_delay_s), 3),
                        round(rng.uniform(*prof.resume_s), 3),
                        rng.random() < prof.p_takeover,
                    )
                )
            faults: list[SpaceFault] = []
            for kind in FAULT_KINDS:
                p_kind = prof.p_fault(kind)
                if kind == "space_pause" and not p_kind:
                    continue
                if rng.random() < p_kind:
                    dur = (
                        round(rng.uniform(*prof.space_pause_s), 3)
                        if kind == "space_pause"
                        else None
                    )
                    if rng.random() < prof.p_after_kill and (fp is not None or kills):
                        faults.append(SpaceFault(kind, trigger="after_kill", duration_s=dur))
                    else:
                        at = round(rng.uniform(*prof.fault_delay_s), 3)
                        faults.append(SpaceFault(kind, at_s=at, duration_s=dur))
            plans.append(AttemptPlan(fp, kills, tuple(faults), tuple(pauses)))
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
