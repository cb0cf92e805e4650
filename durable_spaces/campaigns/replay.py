"""A failing seed fails again: exact replays of a run, and how alike two runs were.

A seed reproduces a schedule, not an interleaving: a fault placed in time lands wherever
the machine's load puts it. What a run really went through is in its record
(``extra["interleaving"]``, written by ``campaigns/inject.py``): every fault, the attempt
it hit and the point of the driver's trace where it landed. ``exact_spec`` turns that
back into a run whose every fault is placed at that point (``Schedule.exact``), so the
replay stops each driver where the original was hit and inflicts the same fault there.

``signature`` is the part of an interleaving that must be the same for two runs to have
gone the same way (the faults with their positions and outcomes, and how each attempt
ended); ``differences`` says where two runs parted. ``Reproduction`` is what a campaign
reports for each failed run it replays ("reproduced k/N").
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.spec import (
    BEHAVIOUR_ENV,
    MAX_ATTEMPTS,
    LabSettings,
    RunSpec,
    check_env,
    check_schedule,
    check_seed,
)
from durable_spaces.chaos import mutants
from durable_spaces.chaos.schedule import Schedule
from durable_spaces.errors import ConfigError


def exact_spec(record: RunRecord, state_dir: str, run_id: str | None = None) -> RunSpec:
    """A run that replays ``record``'s realized interleaving (``ConfigError`` when the
    record has no interleaving or schedule to replay, or when what it says is not a run
    the flags could ask for: ``RunSpec`` checks it as ``campaign``'s options are)."""
    realized = record.extra.get("interleaving")
    if not isinstance(realized, list) or record.schedule is None:
        raise ConfigError(
            f"run record {record.run_id} has no realized interleaving to replay exactly "
            "(it was written before interleavings were recorded); repro it by seed"
        )
    where = f"run record {record.run_id}"
    check_seed(f"{where}: seed", record.seed)
    check_interleaving(realized, where)
    try:
        drawn = Schedule.from_json(record.schedule)
        schedule = Schedule.exact(record.seed, check_schedule(drawn, f"{where}: schedule"),
                                  realized)  # fmt: skip
    except ConfigError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        why = f"{type(e).__name__}: {e}"
        raise ConfigError(f"{where}: its schedule or interleaving is not one: {why}") from None
    profile = record.extra.get("profile") or "default"  # "" or null in older records
    return RunSpec(
        run_id=run_id or record.run_id,
        seed=record.seed,
        mode=record.mode,
        backend=record.backend,
        calls=record.calls,
        durable_mode=record.durable_mode or "transactional",
        profile=profile,
        state_dir=state_dir,
        schedule=schedule,
        scenario=record.scenario or "",  # "": the one the record's mode names
    )


def check_interleaving(realized: Sequence[Any], where: str) -> None:
    """The realized records ``Schedule.exact`` reads, as ``campaigns/inject.py`` writes
    them: objects, an attempt number below ``MAX_ATTEMPTS``, ``at`` and ``value`` objects
    (``ConfigError`` otherwise: an attempt of 10**9 would make as many plans)."""
    for k, r in enumerate(realized):
        at = f"{where}: interleaving[{k}]"
        if not isinstance(r, Mapping):
            raise ConfigError(f"{at} is not an object")
        if r.get("type") not in ("ok", "info"):
            continue  # not replayed (Schedule.exact skips it)
        attempt = r.get("attempt")
        if type(attempt) is not int or not 0 <= attempt < MAX_ATTEMPTS:
            raise ConfigError(f"{at}: attempt {attempt!r} is not between 0 and {MAX_ATTEMPTS - 1}")
        for name in ("at", "value"):
            if r.get(name) is not None and not isinstance(r.get(name), Mapping):
                raise ConfigError(f"{at}: {name} is not an object")
        if not isinstance(r.get("kind"), str):
            raise ConfigError(f"{at}: kind {r.get('kind')!r} is not a name")


def recorded_env(record: RunRecord) -> dict[str, str] | None:
    """The ``recorded_env`` ``record``'s run had (None: the record is older than that,
    and says nothing); ``ConfigError`` for one that is not what a run writes."""
    if "env" not in record.extra:
        return None
    return check_env(record.extra["env"], f"run record {record.run_id}")


def take_env(env: Mapping[str, str]) -> None:
    """Make this process's ``BEHAVIOUR_ENV`` exactly ``env`` (what a replay's drivers
    inherit; the mutants this process asks about follow)."""
    for k in BEHAVIOUR_ENV:
        os.environ.pop(k, None)
    os.environ.update(env)
    mutants.load(LabSettings.from_env(env).mutants)


def _position(at: Mapping[str, Any]) -> tuple[Any, ...]:
    if "trigger" in at:
        return ("trigger", at["trigger"])
    if "point" in at:
        # Where the driver was when the fault landed counts only where it is not the point
        # itself: a kill the original run took at a failpoint or at a random time records
        # no ``landed``, its exact replay's stop at that point records it as the point.
        landed = at.get("landed")
        if landed is None or list(landed) == [at["point"], at.get("n")]:
            return (at["point"], at.get("n"))
        return (at["point"], at.get("n"), "landed", *landed)
    return ("start",)


def signature(record: RunRecord) -> list[tuple[Any, ...]]:
    """What must match for two runs to have gone the same way: the faults (attempt, kind,
    position, outcome) in order, each attempt's exit code, and the recovery decisions in
    order (epoch, kind, call): where a fault landed shows in what recovery had to do."""
    out: list[tuple[Any, ...]] = []
    for r in record.extra.get("interleaving") or []:
        if r.get("type") == "cancelled":
            # Never happened: an exact replay's schedule leaves it out (``Schedule.exact``),
            # so counting it made every replay of a run with one look different.
            continue
        out.append(("fault", r.get("attempt"), r.get("kind"), _position(r.get("at") or {}),
                    r.get("type")))  # fmt: skip
    out.extend(("exit", i, code) for i, code in enumerate(record.extra.get("exit_codes") or []))
    out.extend(("recovery", x) for x in record.extra.get("recovery_sequence") or [])
    return out


def differences(a: RunRecord, b: RunRecord, limit: int = 5) -> list[str]:
    """Where two runs' interleavings parted (empty: they went the same way)."""
    sa, sb = signature(a), signature(b)
    out = []
    for i in range(max(len(sa), len(sb))):
        x = sa[i] if i < len(sa) else None
        y = sb[i] if i < len(sb) else None
        if x != y:
            out.append(f"#{i}: {_show(x)} | {_show(y)}")
            if len(out) >= limit:
                break
    return out


def _show(item: tuple[Any, ...] | None) -> str:
    if item is None:
        return "(nothing)"
    if item[0] == "exit":
        return f"attempt {item[1]} exited {item[2]}"
    if item[0] == "recovery":
        return f"recovery {item[1]}"
    _, attempt, kind, pos, type_ = item
    where = "/".join(str(p) for p in pos)
    return f"{kind} at {where} of attempt {attempt} ({type_})"


#: A replay's difference from the original when it had none but passed.
SAME = "same interleaving, run passed"


@dataclass
class Reproduction:
    """A failed run replayed exactly ``tries`` times."""

    run_id: str
    tries: int
    reproduced: int
    #: For each replay that did not fail: how its interleaving differed from the original.
    differences: list[list[str]] = field(default_factory=list)

    @property
    def flaky(self) -> bool:
        return self.reproduced == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "tries": self.tries,
            "reproduced": self.reproduced,
            "never_reproduced": self.flaky,
            "differences": self.differences,
        }

    def line(self) -> str:
        tail = ""
        if self.flaky and all(d == [SAME] for d in self.differences):
            # The record's interleaving, faithfully replayed, passes: what failed is not
            # in what the record holds (a timing), or the code changed since.
            tail = " (never reproduced, though each replay had the same interleaving)"
        elif self.flaky:
            tail = " (never reproduced: the interleavings differ, see the report)"
        return f"REPRODUCED {self.run_id} {self.reproduced}/{self.tries}{tail}"


def reproduction(original: RunRecord, replays: Sequence[RunRecord]) -> Reproduction:
    rep = Reproduction(original.run_id, len(replays), 0)
    for r in replays:
        if r.outcome == "failed":
            rep.reproduced += 1
        else:
            rep.differences.append(differences(original, r) or [SAME])
    return rep
