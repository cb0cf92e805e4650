"""Scenarios by name, and how ``--mode``/``--scenario``/``--durable-mode`` (and their
``CRASH_*`` variables) become a run: the old spellings mean what they meant, SUMMARY's
``mode=`` keeps its values, and a repro line names the scenario and the adapter's mode
explicitly and runs the same spec again through the real CLI."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import get_args

import pytest
from typer.testing import CliRunner

from durable_spaces import cli
from durable_spaces.adapter.config import Mode
from durable_spaces.backends import CLAIMS, known_backends
from durable_spaces.campaigns import scenarios
from durable_spaces.campaigns.scenarios.base import KILL_POINTS, get
from durable_spaces.campaigns.spec import (
    BACKENDS,
    DURABLE_MODES,
    MODE_ALIASES,
    SCENARIOS,
    CampaignSpec,
    RunSpec,
)
from durable_spaces.chaos import points
from durable_spaces.errors import ConfigError
from durable_spaces.space import Faults


def test_every_registered_scenario_loads_and_has_the_interface() -> None:
    assert SCENARIOS == tuple(scenarios.known_scenarios()) == tuple(scenarios.SCENARIOS)
    for name in SCENARIOS:
        s = get(name)
        assert s.name == name
        for part in ("script", "schedule", "drive", "checks"):
            assert callable(getattr(s, part)), (name, part)
        assert isinstance(dict(s.checks()), dict)
    with pytest.raises(ConfigError, match="unknown campaign scenario 'chaos'"):
        get("chaos")


def test_names_listed_once_derive_from_their_registries() -> None:
    # the campaign's backends are the registry's that take faults (remote's are its host's)
    assert tuple(n for n in known_backends() if Faults in CLAIMS[n]) == BACKENDS
    assert {"local", "spacesd", "docker", "microvm"} <= set(BACKENDS)
    assert set(DURABLE_MODES) == set(get_args(Mode))
    assert set(MODE_ALIASES) <= set(SCENARIOS) and scenarios.DEFAULT not in MODE_ALIASES
    assert points.unknown(KILL_POINTS) == []


# (CRASH_*/options as given) -> (scenario, adapter mode, SUMMARY mode=)
SPELLINGS = {
    "nothing": ({}, ("random", "transactional", "transactional")),
    "mode-auto": ({"mode": "auto"}, ("random", "auto", "auto")),
    "mode-checkpoint": ({"mode": "checkpoint"}, ("random", "checkpoint", "checkpoint")),
    "mode-stale": ({"mode": "stale"}, ("stale", "transactional", "stale")),
    "mode-stale-durable": (
        {"mode": "stale", "durable_mode": "checkpoint"},
        ("stale", "checkpoint", "stale"),
    ),
    "mode-exhaustive": ({"mode": "exhaustive"}, ("exhaustive", "transactional", "exhaustive")),
    "mode-server": ({"mode": "server", "backend": "microvm"}, ("server", "checkpoint", "server")),
    "scenario-stale-mode-auto": (
        {"scenario": "stale", "mode": "auto"},
        ("stale", "auto", "stale"),
    ),
    "scenario-server": (
        {"scenario": "server", "backend": "microvm"},
        ("server", "checkpoint", "server"),
    ),
    "scenario-random-mode-auto": (
        {"scenario": "random", "mode": "auto"},
        ("random", "auto", "auto"),
    ),
    # a campaign named by one mode and run in another, as before
    "mode-checkpoint-durable-auto": (
        {"mode": "checkpoint", "durable_mode": "auto"},
        ("random", "auto", "checkpoint"),
    ),
}


@pytest.mark.parametrize(("given", "want"), SPELLINGS.values(), ids=SPELLINGS.keys())
def test_spellings(given: dict[str, str], want: tuple[str, str, str]) -> None:
    spec = CampaignSpec(jobs=1, **given)  # type: ignore[arg-type]
    assert (spec.scenario, spec.adapter_mode, spec.mode) == want
    run = spec.run(3, "/tmp/unused")
    assert (run.scenario, run.durable_mode, run.mode) == want
    assert RunSpec.from_json(run.to_json()) == run
    assert CampaignSpec(**spec.to_json()) == spec  # resolving is idempotent


def test_the_environment_and_its_precedence() -> None:
    env = {"CRASH_SCENARIO": "stale", "CRASH_MODE": "auto"}
    s = CampaignSpec.from_env(env, jobs=1)
    assert (s.scenario, s.adapter_mode, s.mode) == ("stale", "auto", "stale")
    # an option replaces its variable: --mode checkpoint over CRASH_MODE=stale, as before
    s = CampaignSpec.from_env({"CRASH_MODE": "stale"}, mode="checkpoint", jobs=1)
    assert (s.scenario, s.adapter_mode, s.mode) == ("random", "checkpoint", "checkpoint")
    with pytest.raises(ConfigError, match="CRASH_SCENARIO"):
        CampaignSpec.from_env({"CRASH_SCENARIO": "chaotic"})
    with pytest.raises(ConfigError, match="needs --backend/CRASH_BACKEND=microvm"):
        CampaignSpec(scenario="server", backend="local", jobs=1)


def test_a_scenario_is_never_run_in_a_mode_it_cannot_test() -> None:
    """The server scenario's kills wait on machine checkpoints: in transactional mode they
    never land. An inherited CRASH_MODE (the Makefile exports one) is refused by name."""
    ok = CampaignSpec.from_env({}, scenario="server", backend="microvm", jobs=1)
    assert ok.adapter_mode == "checkpoint"
    for env in ({"CRASH_MODE": "transactional"}, {"CRASH_DURABLE_MODE": "auto"}):
        with pytest.raises(ConfigError, match="server scenario runs the adapter in checkpoint"):
            CampaignSpec.from_env(env, scenario="server", backend="microvm", jobs=1)


def test_a_run_from_an_old_record_or_spec_file_gets_its_scenario_from_its_mode() -> None:
    old = {"run_id": "r", "seed": "s-1", "mode": "stale", "backend": "local", "calls": 3,
           "durable_mode": "checkpoint", "profile": "default", "state_dir": "", "index": 0,
           "schedule": None}  # fmt: skip
    run = RunSpec.from_json(old)
    assert (run.scenario, run.durable_mode, run.mode) == ("stale", "checkpoint", "stale")
    assert RunSpec.from_json({**old, "mode": "auto"}).scenario == "random"


REPROS = {
    "random": (CampaignSpec(mode="auto", jobs=1), "--mode auto --backend local"),
    "stale": (CampaignSpec(mode="stale", jobs=1), "--scenario stale --mode transactional"),
    "exhaustive-checkpoint": (
        CampaignSpec(scenario="exhaustive", mode="checkpoint", jobs=1),
        "--scenario exhaustive --mode checkpoint",
    ),
    "server": (
        CampaignSpec(mode="server", backend="microvm", jobs=1),
        "--scenario server --mode checkpoint",
    ),
}


@pytest.mark.parametrize(("spec", "part"), REPROS.values(), ids=REPROS.keys())
def test_a_repro_line_is_explicit_and_runs_the_same_spec(
    spec: CampaignSpec, part: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = spec.run(7, str(tmp_path))
    line = run.repro()
    assert part in line and "--durable-mode" not in line
    monkeypatch.setattr(cli.campaigns, "SESSION_MODULE", "toy_cli_session")
    argv = shlex.split(line)[1:]
    r = CliRunner().invoke(cli.app, [*argv, "--state-dir", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    body = r.stdout[: r.stdout.rindex("\nRESULT ")]
    again = RunSpec.from_json(json.loads(body)["extra"]["spec"])
    assert (again.scenario, again.durable_mode, again.mode, again.seed, again.calls) == (
        run.scenario, run.durable_mode, run.mode, run.seed, run.calls,
    )  # fmt: skip
