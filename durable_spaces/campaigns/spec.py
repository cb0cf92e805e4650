"""What a campaign and each of its runs are, from CLI options or ``CRASH_*`` variables.

A ``CampaignSpec`` is the user's request; ``RunSpec`` is one run of it, complete enough
to be replayed alone (``durable-spaces repro``) and shrunk (``campaigns.shrink``). Both
are data with a JSON round-trip, so they cross process boundaries as text.

Two things are named apart: the **scenario** (how a run is driven: ``random``, ``stale``,
``exhaustive``, ``server``; ``--scenario``/``CRASH_SCENARIO``, registered in
``campaigns/scenarios/``) and the **adapter's mode** (``transactional``, ``auto``,
``checkpoint``; ``--mode``/``CRASH_MODE``, or ``--durable-mode``/``CRASH_DURABLE_MODE``).
Before scenarios had a name of their own, ``--mode`` took both, and it still does: a
scenario name there (``--mode stale``) is an alias for ``--scenario stale`` with the
scenario's default adapter mode. What a campaign is called (``mode`` after
construction: SUMMARY's ``mode=``, the records' ``mode``, report columns) stays what it
was: the adapter's mode of a ``random`` campaign, the scenario's name otherwise.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from durable_spaces.backends import CLAIMS, known_backends
from durable_spaces.campaigns.record import RUN_ID_RE
from durable_spaces.campaigns.scenarios import DEFAULT, Tolerance, known_scenarios, registration
from durable_spaces.chaos import mutants
from durable_spaces.chaos.schedule import PROFILES, Schedule
from durable_spaces.errors import ConfigError
from durable_spaces.settings import EnvFields, Settings, parse_switch, setting
from durable_spaces.space import Faults

#: The adapter's modes (``durable_spaces.adapter.config.Mode``; a test holds them equal).
DURABLE_MODES = ("transactional", "checkpoint", "auto")
#: Scenario names ``--mode``/``CRASH_MODE`` still takes (the spelling before scenarios).
MODE_ALIASES = ("stale", "exhaustive", "server")
#: What ``--mode``/``CRASH_MODE`` accepts.
MODES = ("transactional", "auto", "checkpoint", *MODE_ALIASES)
#: The registered backends a campaign can attack: those whose Spaces take faults (a
#: ``remote`` Space is its cluster host's, and so are its faults).
BACKENDS = tuple(name for name in known_backends() if Faults in CLAIMS.get(name, ()))
#: The backends whose Spaces can run the change journal in the Space
#: (``spacesd/guest_journal.py``): what ``journal_kill`` kills.
JOURNAL_BACKENDS = ("spacesd", "docker", "microvm")
SCENARIOS = tuple(known_scenarios())


def _choice(var: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{var}={value!r} is not one of: {', '.join(choices)}")
    return value


def _mutants(name: str, raw: str) -> str:
    mutants.check(raw)  # ConfigError naming DS_MUTANTS and the unknown names
    return raw


@dataclass(frozen=True)
class LabSettings(EnvFields):
    """The lab's own ``DS_*`` variables (``docs/configuration.md``), read here once, at the
    edge of each lab process (the campaign command, a worker, the scripted driver at its
    exit). The product's are ``durable_spaces/settings.py``'s ``Settings``; a campaign's
    processes inherit both through their environment, and every run record carries both
    (``recorded_env``)."""

    warm_workers: bool = setting(
        "DS_WARM_WORKERS", True, parse_switch,
        doc="the runner keeps a spare worker process started before its run",
    )  # fmt: skip
    fast_exit: bool = setting(
        "DS_FAST_EXIT", True, parse_switch,
        doc="a worker and the scripted driver end without the interpreter's teardown",
    )  # fmt: skip
    zygote: bool = setting(
        "DS_ZYGOTE", True, parse_switch,
        doc="the campaign's zygote forks spare drivers and workers (with DS_WARM_DRIVERS)",
    )  # fmt: skip
    mutants: str | None = setting(
        "DS_MUTANTS", None, _mutants,
        doc="deliberately broken adapters the lab must catch (chaos/mutants.py), "
        "comma-separated; read by chaos/mutants.py in every process",
    )  # fmt: skip


#: The variables that change which code a run takes (the switches, the mutants, the
#: log's durability, the microvm's knobs): a run's record carries every one of them with
#: its value (``recorded_env``: the whole configuration, defaults included) and its
#: repro command those not at their default, since a seed replayed without them takes
#: another path (CI's journal-in-space campaign runs with ``DS_HOST_SCAN=0``; its repro
#: lines once named no such thing). Machine-local places (caches, binaries) are not.
BEHAVIOUR_ENV = (*Settings.names(recorded_only=True), *LabSettings.names())
_ENV_VALUE = re.compile(r"[A-Za-z0-9_.,:=+-]{0,200}", re.ASCII)


def recorded_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole recorded configuration of ``env`` (the process's by default): every
    ``BEHAVIOUR_ENV`` variable with its value, defaults included (``ConfigError`` for a
    malformed one)."""
    e = os.environ if env is None else env
    return Settings.from_env(e).to_env(recorded_only=True) | LabSettings.from_env(e).to_env()


def behaviour_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Those of ``recorded_env`` not at their default (what a repro line names)."""
    defaults = Settings().to_env(recorded_only=True) | LabSettings().to_env()
    return {k: v for k, v in recorded_env(env).items() if defaults.get(k) != v}


def check_env(env: object, where: str) -> dict[str, str]:
    """``env`` read back from a run record, as ``recorded_env`` wrote it, or this
    process's own (``campaign`` and ``repro`` check it before any work, one way for
    both): only those names, short plain values, each read as ``Settings`` and
    ``LabSettings`` read them (switches 0 or 1, known mutants, a log format and level
    the driver takes); ``ConfigError`` in one line otherwise (a record's is about to
    become this process's environment). A name the record lacks takes its default."""
    if not isinstance(env, Mapping):
        raise ConfigError(f"{where}: the environment is not a mapping of names to values")
    out: dict[str, str] = {}
    for k, v in env.items():
        if k not in BEHAVIOUR_ENV:
            raise ConfigError(f"{where}: {k!r} is not one of {', '.join(BEHAVIOUR_ENV)}")
        if not isinstance(v, str) or not _ENV_VALUE.fullmatch(v):
            raise ConfigError(f"{where}: {k}={v!r} is not a plain value")
        out[k] = v
    try:
        Settings.from_env(out)
        LabSettings.from_env(out)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return out


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


#: A schedule's bounds (what a drawn one never comes near; a record's or a file's beyond
#: them is not a run's): attempts (the coordinator stops after its ``max_attempts``, 20 by
#: default), a point's hit number (about 20 logical hits a call), and any time in it.
MAX_ATTEMPTS = 1000
MAX_HIT = 100 * MAX_CALLS
MAX_DELAY_S = 24 * 3600.0
#: A failpoint's name goes into ``DS_FAILPOINTS`` (``name:n[:action]``, comma-separated).
_POINT_NAME = re.compile(r"[A-Za-z0-9_.*-]{1,100}", re.ASCII)


def _hit(var: str, n: object) -> None:
    if type(n) is not int or not 1 <= n <= MAX_HIT:
        raise ConfigError(f"{var}={n!r} is not a hit number between 1 and {MAX_HIT}")


def _delay(var: str, x: object, *, optional: bool = False) -> None:
    if x is None and optional:
        return
    number = isinstance(x, int | float) and not isinstance(x, bool)
    if not number or not math.isfinite(x) or not 0 <= x <= MAX_DELAY_S:  # type: ignore[arg-type,operator]
        raise ConfigError(f"{var}={x!r} is not a time between 0 and {MAX_DELAY_S:g} s")


def check_schedule(schedule: Schedule, where: str) -> Schedule:
    """``schedule`` within the bounds a run can have (``ConfigError`` naming ``where`` and
    the field): its seed one safe word, at most ``MAX_ATTEMPTS`` attempts, hit numbers
    1..``MAX_HIT``, every time and duration finite and within ``MAX_DELAY_S``, point
    names one word. Kinds and triggers are checked where each record is made
    (``chaos/faults.py``)."""
    check_seed(f"{where}: seed", schedule.seed)
    if len(schedule.attempts) > MAX_ATTEMPTS:
        raise ConfigError(f"{where}: {len(schedule.attempts)} attempts, over {MAX_ATTEMPTS}")
    for i, a in enumerate(schedule.attempts):
        at = f"{where}: attempt {i}"
        if a.failpoint is not None:
            if not isinstance(a.failpoint.name, str) or not _POINT_NAME.fullmatch(a.failpoint.name):
                raise ConfigError(f"{at}: failpoint {a.failpoint.name!r} is not a point's name")
            _hit(f"{at}: failpoint n", a.failpoint.n)
            if a.failpoint.action not in ("kill", "pause"):
                raise ConfigError(f"{at}: failpoint action {a.failpoint.action!r}")
        for x in a.kill_after_s:
            _delay(f"{at}: kill_after_s", x)
        for f in a.faults:
            _delay(f"{at}: {f.kind} at_s", f.at_s, optional=True)
            _delay(f"{at}: {f.kind} duration_s", f.duration_s, optional=True)
            _delay(f"{at}: {f.kind} resume_s", f.resume_s)
        for pz in a.pauses:
            _delay(f"{at}: pause at_s", pz.at_s, optional=True)
            _delay(f"{at}: pause resume_s", pz.resume_s)
        for pf in a.at_points:
            if not isinstance(pf.point, str) or not _POINT_NAME.fullmatch(pf.point):
                raise ConfigError(f"{at}: point {pf.point!r} is not a point's name")
            _hit(f"{at}: {pf.kind} at {pf.point} n", pf.n)
            _delay(f"{at}: {pf.kind} duration_s", pf.duration_s, optional=True)
            _delay(f"{at}: {pf.kind} resume_s", pf.resume_s)
    return schedule


def check_seed(var: str, value: str) -> str:
    """A seed or seed base: one word of ``[A-Za-z0-9._-]`` starting with a letter or digit,
    at most 128 characters (it names files and is pasted into shells)."""
    if not isinstance(value, str) or not SEED_RE.fullmatch(value):
        raise ConfigError(
            f"{var}={value!r} must be one word of letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit, at most 128 characters)"
        )
    return value


def resolve(mode: str, scenario: str, durable_mode: str | None) -> tuple[str, str, str]:
    """``(scenario, adapter mode, name)`` from ``--mode``, ``--scenario`` and
    ``--durable-mode`` as given ("" or None: not given); ``ConfigError`` naming the option.

    The scenario is ``--scenario``, else the one ``--mode`` names (an alias), else
    ``random``; the adapter's mode is ``--durable-mode``, else the one ``--mode`` names,
    else the scenario's default. The name is the scenario's, or for ``random`` the
    adapter mode ``--mode`` named (else the one resolved)."""
    if mode:
        _choice("--mode/CRASH_MODE", mode, MODES)
    if scenario:
        _choice("--scenario/CRASH_SCENARIO", scenario, SCENARIOS)
    if durable_mode is not None:
        _choice("--durable-mode/CRASH_DURABLE_MODE", durable_mode, DURABLE_MODES)
    named = mode if mode in DURABLE_MODES else ""
    scen = scenario or (mode if mode in MODE_ALIASES else DEFAULT)
    adapter = durable_mode or named or registration(scen).default_mode
    name = scen if scen != DEFAULT else (named or adapter)
    return scen, adapter, name


def check_run(
    mode: str,
    scenario: str | None,
    durable_mode: str | None,
    backend: str,
    profile: str,
    calls: int,
) -> tuple[str, str, str]:
    """What every run is, checked one way whether it comes from flags, ``CRASH_*``
    variables, a run record (``repro --exact``) or a spec read back from the queue:
    ``(scenario, adapter mode, name)`` as ``resolve`` gives them, else ``ConfigError``
    naming the option the value stands for (a record's ``calls=10**9`` is refused as
    ``--calls 1000000000`` is)."""
    for var, value in (("--mode/CRASH_MODE", mode), ("--backend/CRASH_BACKEND", backend),
                       ("--profile/CRASH_PROFILE", profile)):  # fmt: skip
        if not isinstance(value, str):
            raise ConfigError(f"{var}={value!r} is not a name")
    for var, opt in (("--scenario/CRASH_SCENARIO", scenario),
                     ("--durable-mode/CRASH_DURABLE_MODE", durable_mode)):  # fmt: skip
        if opt is not None and not isinstance(opt, str):
            raise ConfigError(f"{var}={opt!r} is not a name")
    scen, adapter, name = resolve(mode, scenario or "", durable_mode)
    _choice("--backend/CRASH_BACKEND", backend, BACKENDS)
    if type(calls) is not int:  # a flag's string is converted before: here a number only
        raise ConfigError(f"--calls/CRASH_CALLS={calls!r} is not an integer")
    _positive_int("--calls/CRASH_CALLS", calls, MAX_CALLS)
    _choice("--profile/CRASH_PROFILE", profile, tuple(PROFILES))
    if PROFILES[profile].power and backend not in ("local", "spacesd"):
        raise ConfigError(
            f"--profile/CRASH_PROFILE {profile} (power losses, a slow disk) runs on "
            "--backend/CRASH_BACKEND=local or spacesd only: their Spaces' state is on "
            f"the host's powerfs mount (campaigns/power.py), not {backend}'s"
        )
    if PROFILES[profile].p_journal_kill and backend not in JOURNAL_BACKENDS:
        raise ConfigError(
            f"--profile/CRASH_PROFILE {profile} (the change journal's helper in the "
            f"Space killed) runs on --backend/CRASH_BACKEND={'/'.join(JOURNAL_BACKENDS)} "
            f"(a microvm's Space runs the helper, spacesd's and docker's with "
            f"DS_HOST_SCAN=0), not {backend}: its Spaces run none"
        )
    needs = registration(scen)
    if needs.backend is not None and backend != needs.backend:
        raise ConfigError(
            f"the {scen} scenario (--scenario/CRASH_SCENARIO, or --mode/CRASH_MODE "
            f"{scen}) needs --backend/CRASH_BACKEND={needs.backend}: {needs.why_backend}"
        )
    if needs.modes is not None and adapter not in needs.modes:
        # Not silently run in another mode: the server scenario's kills wait on machine
        # checkpoints, so in transactional mode they never landed and every run passed
        # having tested nothing (CI inherited CRASH_MODE=transactional from the Makefile).
        raise ConfigError(
            f"the {scen} scenario runs the adapter in {' or '.join(needs.modes)} mode "
            f"(--mode/CRASH_MODE or --durable-mode), not {adapter}: {needs.why_modes}"
        )
    return scen, adapter, name


@dataclass(frozen=True)
class CampaignSpec:
    """A campaign. ``mode``, ``scenario`` and ``durable_mode`` are taken as the options
    are given (see ``resolve``); after construction ``scenario`` and ``durable_mode`` are
    what every run is, and ``mode`` is the campaign's name (see the module doc)."""

    mode: str = ""
    backend: str = "local"
    seed_base: str = "ds"
    runs: int = 20
    calls: int = 6
    jobs: int = field(default_factory=lambda: min(os.cpu_count() or 1, MAX_JOBS))
    #: The adapter mode (``--durable-mode``); resolved from ``mode`` when not given.
    durable_mode: str | None = None
    profile: str = "default"
    scenario: str = ""
    #: The lab's settings (``DS_WARM_WORKERS``, ``DS_FAST_EXIT``, ``DS_ZYGOTE``,
    #: ``DS_MUTANTS``), this process's environment's unless given; put into the
    #: environment of the campaign's workers (and so of their drivers).
    lab: LabSettings = field(default_factory=LabSettings.from_env)

    def __post_init__(self) -> None:
        if isinstance(self.lab, Mapping):  # as ``to_json`` wrote it: its variables, checked
            object.__setattr__(self, "lab", LabSettings.from_env(self.lab))
        scenario, adapter, name = check_run(
            self.mode, self.scenario, self.durable_mode, self.backend, self.profile, self.calls
        )
        object.__setattr__(self, "scenario", scenario)
        object.__setattr__(self, "durable_mode", adapter)
        object.__setattr__(self, "mode", name)
        check_seed("--seed-base/CRASH_SEED_BASE", self.seed_base)
        _positive_int("--runs/CRASH_RUNS", self.runs, MAX_RUNS)
        _positive_int("--jobs/CRASH_JOBS", self.jobs, MAX_JOBS)

    @property
    def adapter_mode(self) -> str:
        """The adapter's mode every run of the campaign has."""
        assert self.durable_mode is not None  # resolved in __post_init__
        return self.durable_mode

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> CampaignSpec:
        """From ``CRASH_*`` (malformed -> ``ConfigError`` naming the variable); options
        given as ``overrides`` (None = not given) win over the environment."""
        e = os.environ if env is None else env
        kw: dict[str, Any] = {}
        for var, key, conv in (
            ("CRASH_MODE", "mode", str),
            ("CRASH_SCENARIO", "scenario", str),
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
        kw["lab"] = LabSettings.from_env(e)
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return CampaignSpec(**kw)

    @property
    def tolerance(self) -> Tolerance:
        """How much of what its schedules plan must land (``campaigns/earned.py``): its
        scenario's."""
        return registration(self.scenario).tolerance

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
            scenario=self.scenario,
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "lab": self.lab.to_env()}  # the lab's as its variables


@dataclass(frozen=True)
class RunSpec:
    """One run. ``schedule`` None: the scenario draws it from ``seed``; given: exactly this
    schedule (exhaustive, shrunk, replayed). ``mode`` is the campaign's name (see the
    module doc), ``durable_mode`` the adapter's mode, ``scenario`` how it is driven ("":
    the one an old ``mode`` spelling names, else ``random``)."""

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
    scenario: str = ""

    def __post_init__(self) -> None:
        # The checks a campaign's flags get (``check_run``), whatever made this run: a
        # campaign, a run record (``repro --exact``), a spec read back from the queue.
        if not isinstance(self.run_id, str) or not RUN_ID_RE.fullmatch(self.run_id):
            raise ConfigError(f"run id {self.run_id!r} is not a safe file name")
        check_seed("--seed", self.seed)
        # ``mode`` is the campaign's name: a scenario's own name (redrive) is no --mode
        mode = "" if self.scenario and self.mode == self.scenario else self.mode
        scenario, _, _ = check_run(
            mode, self.scenario, self.durable_mode, self.backend, self.profile, self.calls
        )
        if not self.scenario:
            object.__setattr__(self, "scenario", scenario)
        if type(self.index) is not int or not 0 <= self.index <= MAX_HIT:
            raise ConfigError(f"run index {self.index!r} is not between 0 and {MAX_HIT}")
        if not isinstance(self.state_dir, str) or "\0" in self.state_dir:
            raise ConfigError(f"state directory {self.state_dir!r} is not a path")
        if self.schedule is not None:
            check_schedule(self.schedule, "the run's schedule")

    def with_(self, **changes: Any) -> RunSpec:
        return replace(self, **changes)

    def repro(self, schedule_file: str | None = None) -> str:
        """The one-line command that runs this alone: ``--scenario`` (unless ``random``)
        and the adapter's ``--mode`` named explicitly, after the ``behaviour_env`` of this
        process's environment (the run's, in the campaign's processes)."""
        mode = self.mode if self.mode in DURABLE_MODES else self.durable_mode
        with_env = behaviour_env()
        parts = ["env", *(f"{k}={v}" for k, v in with_env.items())] if with_env else []
        parts += ["durable-spaces", "repro"]
        if self.scenario != DEFAULT:
            parts += ["--scenario", self.scenario]
        parts += [
            "--mode", mode, "--backend", self.backend, "--seed", self.seed,
            "--calls", str(self.calls),
        ]  # fmt: skip
        if self.durable_mode != mode:  # a campaign named by one mode, run in another
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
