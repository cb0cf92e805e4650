"""The lab's ``log_loss`` fault (``campaigns/log_loss.py``): the log alone on a powerfs
mount loses its unsynced tail, the Space and its host's boot id untouched. Runs of the
``log-loss`` profile where the log's witness (``adapter/log_witness.py``) fires are
consistent; the same seed with the adapter as it was before the witness
(``DS_MUTANTS=log_behind_blind``) runs a forgotten call twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from durable_spaces.campaigns.run import _paths
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.chaos.profiles import PROFILES
from durable_spaces.chaos.schedule import Schedule

pytestmark = pytest.mark.fuse  # tests/needs.py: a skip outside CI, a failure on CI

POINTS = ["call", "start_mark", "spawn", "exit", "outcome_commit"]


def _run(tmp_path: Path, mode: str, seed: str) -> RunSpec:
    return RunSpec(
        run_id="run-0000",
        seed=seed,
        mode=mode,
        backend="local",
        calls=6,
        durable_mode=mode,
        state_dir=str(tmp_path / "run"),
        profile="log-loss",
    )


def test_only_the_log_is_on_the_mount_and_only_log_loss_draws_it(tmp_path: Path) -> None:
    paths = _paths(_run(tmp_path, "transactional", "x"))
    assert paths.session == tmp_path / "run" / "host" / "session"
    assert paths.spaces == tmp_path / "run" / "spaces"  # the Space: the ordinary disk
    assert paths.store == tmp_path / "run" / "store"
    prof = PROFILES["log-loss"]
    assert prof.log_mount and not prof.power and prof.log_synchronous == "NORMAL"
    for name, other in PROFILES.items():
        if name != "log-loss":
            assert not other.p_log_loss and not other.log_mount, name
            kinds = {
                f.kind
                for i in range(20)
                for a in Schedule.draw(f"o-{i}", POINTS, 6, name).attempts
                for f in (*a.faults, *a.at_points)
            }
            assert "log_loss" not in kinds, name


@pytest.mark.parametrize(
    ("mode", "seed", "kept"),
    [("transactional", "ll-tx-13", "prefix"), ("checkpoint", "ll-try-5", "none")],
)
def test_a_log_loss_run_is_caught_up_by_the_witness(
    tmp_path: Path, mode: str, seed: str, kept: str
) -> None:
    """Seeds whose cuts leave the log behind the Space: ``ll-tx-13`` keeps an older
    prefix of the log (the case the boot id cannot see), ``ll-try-5`` loses every commit."""
    from durable_spaces.campaigns.run import run_one

    rec = asyncio.run(run_one(_run(tmp_path, mode, seed)))
    cuts = rec.extra["power"]
    assert any(c["kind"] == "log_loss" and c["kept"] == kept for c in cuts), cuts
    assert all(c["after"]["space_floor"] is not None for c in cuts if c["commits_before"])
    assert rec.outcome == "ok", {k: v["detail"] for k, v in rec.checks.items() if not v["valid"]}
    assert rec.recoveries.get("log_behind", 0) >= 1, rec.recoveries
    assert not (tmp_path / "run" / "host").is_mount()  # unmounted after the run


def test_without_the_witness_a_forgotten_call_runs_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_spaces.campaigns.run import run_one

    monkeypatch.setenv("DS_MUTANTS", "log_behind_blind")  # the drivers' adapter
    rec = asyncio.run(run_one(_run(tmp_path, "transactional", "ll-tx-13")))
    assert rec.outcome == "failed"
    assert "log_behind" not in rec.recoveries
    found = {a["name"] for c in rec.checks.values() for a in c.get("anomalies", [])}
    assert "duplicate_effect" in found, found
