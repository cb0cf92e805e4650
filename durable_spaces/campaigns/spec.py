"""What a campaign and each of its runs are, from CLI options or ``CRASH_*`` variables.

A ``CampaignSpec`` is the user's request; ``RunSpec`` is one run of it, complete enough
to be replayed alone (``durable-spaces repro``) and shrunk (``campaigns.shrink``). Both
are data with a JSON round-trip, so they cross process boundaries as text.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from durable_spaces.chaos.schedule import PROFILES, Schedule
from durable_spaces.errors import ConfigError

MODES = ("transactional", "auto", "checkpoint", "stale", "exhaustive", "server")
BACKENDS = ("local", "spacesd", "docker", "microvm")
DURABLE_MODES = ("transactional", "checkpoint", "auto")


def _choice(var: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{var}={value!r} is not one of: {', '.join(choices)}")
    return value


#: Caps on what one campaign may ask for: beyond them a typo, not a plan (a run of 10k
#: calls takes hours; 10k runs a day).
MAX_RUNS = 10_000
MAX_CALLS = 10_000
MAX_JOBS = 256
#: A seed goes into file names and printed shell commands: one safe word.
SEED_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def _positive_int(var: str, value: str | int, cap: int) -> int:
    """1..cap; a string must be ASCII digits (``int()`` would take " 5" or "\\uff15")."""
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise ConfigError(f"{var}={value!r} is not a positive integer")
        if len(value.lstrip("0")) > len(str(cap)):
            raise ConfigError(f"{var}={value[:20]!r}... is over the limit of {cap}")
        n = int(value)
    elif type(value) is int:
        n = value
    else:
        raise ConfigError(f"{var}={value!r} is not an integer")
    if n < 1:
        raise ConfigError(f"{var}={value!r} must be at least 1")
    if n > cap:
        raise ConfigError(f"{var}={value!r} is over the limit of {cap}")
    return n


def check_seed(var: str, value: str) -> str:
    """A seed or seed base: one word of ``[A-Za-z0-9._-]`` starting with a letter or digit,
    at most 128 characters (it names files and is pasted into shells)."""
    if not isinstance(value, str) or not SEED_RE.fullmatch(value):
        raise ConfigError(
            f"{var}={value!r} must be one word of letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit, at most 128 characters)"
        )
    return value


@dataclass(frozen=True)
class CampaignSpec:
    mode: str = "transactional"
    backend: str = "local"
    seed_base: str = "ds"
    runs: int = 20
    calls: int = 6
    jobs: int = field(default_factory=lambda: min(os.cpu_count() or 1, MAX_JOBS))
    #: The adapter mode; derived from ``mode`` when it names one, else transactional.
    durable_mode: str | None = None
    profile: str = "default"

    def __post_init__(self) -> None:
        _choice("--mode/CRASH_MODE", self.mode, MODES)
        _choice("--backend/CRASH_BACKEND", self.backend, BACKENDS)
        check_seed("--seed-base/CRASH_SEED_BASE", self.seed_base)
        _positive_int("--runs/CRASH_RUNS", self.runs, MAX_RUNS)
        _positive_int("--calls/CRASH_CALLS", self.calls, MAX_CALLS)
        _positive_int("--jobs/CRASH_JOBS", self.jobs, MAX_JOBS)
        if self.durable_mode is not None:
            _choice("--durable-mode/CRASH_DURABLE_MODE", self.durable_mode, DURABLE_MODES)
        _choice("--profile/CRASH_PROFILE", self.profile, tuple(PROFILES))
        if self.mode == "server" and self.backend != "microvm":
            raise ConfigError(
                "CRASH_MODE=server needs CRASH_BACKEND=microvm: only whole-machine "
                "checkpoints bring a process back after a restore"
            )

    @property
    def adapter_mode(self) -> str:
        if self.durable_mode is not None:
            return self.durable_mode
        if self.mode == "server":
            return "checkpoint"  # processes survive only whole-machine checkpoints
        return self.mode if self.mode in DURABLE_MODES else "transactional"

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> CampaignSpec:
        """From ``CRASH_*`` (malformed -> ``ConfigError`` naming the variable); options
        given as ``overrides`` (None = not given) win over the environment."""
        e = os.environ if env is None else env
        kw: dict[str, Any] = {}
        for var, key, conv in (
            ("CRASH_MODE", "mode", str),
            ("CRASH_BACKEND", "backend", str),
            ("CRASH_SEED_BASE", "seed_base", str),
            ("CRASH_DURABLE_MODE", "durable_mode", str),
            ("CRASH_PROFILE", "profile", str),
            ("CRASH_RUNS", "runs", lambda v: _positive_int("--runs/CRASH_RUNS", v, MAX_RUNS)),
            ("CRASH_CALLS", "calls", lambda v: _positive_int("--calls/CRASH_CALLS", v, MAX_CALLS)),
            ("CRASH_JOBS", "jobs", lambda v: _positive_int("--jobs/CRASH_JOBS", v, MAX_JOBS)),
        ):
            raw = e.get(var)
            if raw is not None and raw.strip() != "":
                kw[key] = conv(raw.strip())
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return CampaignSpec(**kw)

    def run(self, index: int, state_root: str, schedule: Schedule | None = None) -> RunSpec:
        """The ``index``-th run (seed ``<seed_base>-<index>``)."""
        run_id = f"run-{index:04d}"
        return RunSpec(
            run_id=run_id,
            index=index,
            seed=f"{self.seed_base}-{index}" if schedule is None else schedule.seed,
            mode=self.mode,
            backend=self.backend,
            calls=self.calls,
            durable_mode=self.adapter_mode,
            profile=self.profile,
            state_dir=os.path.join(state_root, run_id),
            schedule=schedule,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunSpec:
    """One run. ``schedule`` None: the session draws it from ``seed`` (with its own list
    of failpoints); given: exactly this schedule (exhaustive, shrunk, replayed)."""

    run_id: str
    seed: str
    mode: str
    backend: str
    calls: int
    durable_mode: str = "transactional"
    profile: str = "default"
    state_dir: str = ""
    index: int = 0
    schedule: Schedule | None = None

    def with_(self, **changes: Any) -> RunSpec:
        return replace(self, **changes)

    def repro(self, schedule_file: str | None = None) -> str:
        """The one-line command that runs this alone."""
        parts = [
            "durable-spaces", "repro", "--mode", self.mode, "--backend", self.backend,
            "--seed", self.seed, "--calls", str(self.calls),
        ]  # fmt: skip
        default = CampaignSpec(mode=self.mode, backend=self.backend, jobs=1).adapter_mode
        if self.durable_mode != default:
            parts += ["--durable-mode", self.durable_mode]
        if self.profile != "default":
            parts += ["--profile", self.profile]
        if schedule_file is not None:
            parts += ["--schedule", schedule_file]
        return shlex.join(parts)

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "schedule"}
        d["schedule"] = None if self.schedule is None else self.schedule.to_json()
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> RunSpec:
        kw = dict(d)
        sched = kw.pop("schedule", None)
        return RunSpec(**kw, schedule=None if sched is None else Schedule.from_json(sched))
