"""What can go wrong in one drive attempt, as plain records (JSON round-trip).

- ``Failpoint``: the driver kills or pauses itself at the n-th hit of a point;
- ``PointFault``: a fault the lab inflicts when the driver reaches the n-th hit of a
  point (``*``: the n-th logical hit of any point): the driver stops there (a
  rendezvous, ``chaos/failpoints.py``'s ``stop``), the fault lands, the driver goes on.
  Its position is part of the run's data, so a replay puts it in the same place;
- ``DriverPause``: SIGSTOP at a time, maybe with a takeover, SIGCONT later;
- ``SpaceFault``: a fault of the Space (or of the host: a power loss, a disk stall) at a
  time after the launch, or on a trigger (``after_kill``: between a driver's death and
  the next launch; ``at_launch``: before this attempt's driver starts);
- a random-time SIGKILL of the driver (``AttemptPlan.kill_after_s``): the in-between
  moments a trace cannot name (a command half-way through its sleep).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from durable_spaces.chaos import points
from durable_spaces.chaos.failpoints import ANY

#: Space faults a schedule can carry (the driver kill is "kill", counted separately).
#: ``power_loss`` is the host's: every process on it killed, its unsynced writes dropped
#: (``chaos/powerfs``), the host booted again (``campaigns/power.py``). ``disk_stall`` is
#: the host's disk not completing durability calls for a while (``chaos/powerfs/disk.py``):
#: the driver stuck inside one, maybe taken over meanwhile (``nemesis.DiskStaller``).
#: ``journal_kill`` is the change journal's helper in the Space killed (what a command
#: of the Space's user that means harm, or the OOM killer, can do: ``journal_kill.JournalKiller``).
#: ``log_loss`` is the log's storage alone losing its unsynced tail (a mount of its own
#: that lost power: a shared mount, another host), its drivers killed with it; the Space
#: and its host go on, the same boot (``nemesis.LogLoss``, ``campaigns/log_loss.py``).
FAULT_KINDS = (
    "daemon_kill",
    "space_restart",
    "space_remove",
    "space_pause",
    "power_loss",
    "disk_stall",
    "journal_kill",
    "log_loss",
)
#: Faults that last a while (their records carry ``duration_s``).
TIMED_KINDS = ("space_pause", "disk_stall")
#: Faults that may come with a takeover (``takeover``, ``resume_s``).
TAKEOVER_KINDS = ("pause", "disk_stall")
#: What a ``PointFault`` may inflict: the Space faults and the driver's own kill/pause.
POINT_KINDS = ("kill", "pause", *FAULT_KINDS)
#: Triggers a Space fault may wait for instead of a time.
TRIGGERS = ("after_kill", "at_launch")
#: Failpoints where a driver is paused with a Space mutation ahead of it or in flight: a
#: continued stale driver would change the workspace there if the Space did not fence it.
PAUSE_POINTS = (
    points.ADAPTER_START_MARK,
    points.ADAPTER_BEFORE_FILE_OP,
    points.ADAPTER_SPAWN,
    points.ADAPTER_OUTCOME_COMMIT,
    points.SPACE_MUTATE,
    points.SPACE_MUTATE_STARTED,
    points.IMAGE_APPLY_OP,
    points.SNAPSHOTS_RESTORE,
    points.RECOVERY_START,
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
    #: How long a ``space_pause`` keeps the machine frozen (a ``disk_stall`` the disk).
    duration_s: float | None = None
    #: A ``disk_stall``'s takeover: the next epoch launched while the driver is stuck,
    #: the disk back ``resume_s`` after that driver's first step.
    takeover: bool = False
    resume_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown Space fault kind {self.kind!r}")
        _check_duration(self.kind, self.duration_s)
        if (self.at_s is None) == (self.trigger is None):
            raise ValueError("a Space fault needs exactly one of at_s and trigger")
        if self.trigger is not None and self.trigger not in TRIGGERS:
            raise ValueError(f"unknown trigger {self.trigger!r}")
        if self.trigger is not None and self.kind == "disk_stall":
            raise ValueError("a disk_stall needs a running driver: at_s, not a trigger")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.at_s is not None:
            d["at_s"] = self.at_s
        else:
            d["trigger"] = self.trigger
        if self.duration_s is not None:
            d["duration_s"] = self.duration_s
        if self.kind in TAKEOVER_KINDS:
            d["takeover"] = self.takeover
            d["resume_s"] = self.resume_s
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SpaceFault:
        dur = d.get("duration_s")
        return SpaceFault(
            str(d["kind"]),
            d.get("at_s"),
            d.get("trigger"),
            None if dur is None else float(dur),
            bool(d.get("takeover", False)),
            float(d.get("resume_s", 0.0)),
        )


def _check_duration(kind: str, duration_s: float | None) -> None:
    if (kind in TIMED_KINDS) != (duration_s is not None):
        raise ValueError(
            f"a {kind} needs duration_s"
            if duration_s is None
            else f"a {kind} takes no duration_s (only {', '.join(TIMED_KINDS)} do)"
        )


@dataclass(frozen=True)
class PointFault:
    """Inflict ``kind`` when the driver reaches the ``n``-th hit of ``point`` (``*``: its
    ``n``-th logical hit). ``kill``: SIGKILL there; ``pause``: the pause (``resume_s``,
    ``takeover``) starts there; ``disk_stall`` (``duration_s``, ``resume_s``,
    ``takeover``): the disk stalls there and the driver goes on into its next durability
    call; a Space fault (``duration_s`` for ``space_pause``) lands while the driver waits
    there, then it is continued."""

    point: str
    n: int
    kind: str
    duration_s: float | None = None
    resume_s: float = 0.0
    takeover: bool = True

    def __post_init__(self) -> None:
        if self.kind not in POINT_KINDS:
            raise ValueError(f"unknown point fault kind {self.kind!r}")
        if self.n < 1:
            raise ValueError(f"a point fault's hit number must be >= 1, not {self.n}")
        _check_duration(self.kind, self.duration_s)

    @property
    def position(self) -> tuple[str, int]:
        return (self.point, self.n)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"point": self.point, "n": self.n, "kind": self.kind}
        if self.duration_s is not None:
            d["duration_s"] = self.duration_s
        if self.kind in TAKEOVER_KINDS:
            d["resume_s"] = self.resume_s
            d["takeover"] = self.takeover
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> PointFault:
        dur = d.get("duration_s")
        return PointFault(
            str(d["point"]),
            int(d["n"]),
            str(d["kind"]),
            None if dur is None else float(dur),
            float(d.get("resume_s", 0.0)),
            bool(d.get("takeover", True)),
        )


@dataclass(frozen=True)
class AttemptPlan:
    """What goes wrong during one drive attempt (index 0 is the first driver)."""

    failpoint: Failpoint | None = None
    kill_after_s: tuple[float, ...] = ()
    faults: tuple[SpaceFault, ...] = ()
    pauses: tuple[DriverPause, ...] = ()
    at_points: tuple[PointFault, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.failpoint or self.kill_after_s or self.faults or self.pauses or self.at_points
        )

    def env(self) -> dict[str, str]:
        """Environment for the attempt's driver: its failpoint and a ``stop`` at every
        point fault's position (or nothing: disarmed)."""
        specs = [self.failpoint.spec()] if self.failpoint else []
        for point, n in dict.fromkeys(f.position for f in self.at_points):
            if self.failpoint is not None and (self.failpoint.name, self.failpoint.n) == (
                point,
                n,
            ):
                continue  # the failpoint's own action wins at its position
            specs.append(f"{point}:{n}:stop")
        return {"DS_FAILPOINTS": ",".join(specs)}

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "failpoint": None if self.failpoint is None else self.failpoint.to_json(),
            "kill_after_s": list(self.kill_after_s),
            "faults": [f.to_json() for f in self.faults],
        }
        if self.pauses:
            d["pauses"] = [p.to_json() for p in self.pauses]
        if self.at_points:
            d["at_points"] = [p.to_json() for p in self.at_points]
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> AttemptPlan:
        fp = d.get("failpoint")
        return AttemptPlan(
            failpoint=None if fp is None else Failpoint.from_json(fp),
            kill_after_s=tuple(float(x) for x in d.get("kill_after_s", ())),
            faults=tuple(SpaceFault.from_json(f) for f in d.get("faults", ())),
            pauses=tuple(DriverPause.from_json(p) for p in d.get("pauses", ())),
            at_points=tuple(PointFault.from_json(p) for p in d.get("at_points", ())),
        )


__all__ = [
    "ANY",
    "FAULT_KINDS",
    "PAUSE_POINTS",
    "POINT_KINDS",
    "TAKEOVER_KINDS",
    "TIMED_KINDS",
    "TRIGGERS",
    "AttemptPlan",
    "DriverPause",
    "Failpoint",
    "PointFault",
    "SpaceFault",
]
