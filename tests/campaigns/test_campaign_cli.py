"""The durable-spaces CLI (typer) with a toy session module in place of the real one."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from durable_spaces import cli
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.summary import Summary

runner = CliRunner()


@pytest.fixture
def toy_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.campaigns, "SESSION_MODULE", "toy_cli_session")


def test_campaign_failure_exit_status_repro_and_report(toy_session: None, tmp_path: Path) -> None:
    out = tmp_path / "c"
    r = runner.invoke(
        cli.app,
        [
            "campaign",
            "--mode",
            "auto",
            "--backend",
            "local",
            "--seed-base",
            "cli",
            "--runs",
            "3",
            "--calls",
            "2",
            "--jobs",
            "2",
            "--out",
            str(out),
            "--no-progress",
        ],
        env={"CRASH_RUNS": "99"},
    )
    assert r.exit_code == 1, r.output
    lines = r.stdout.strip().splitlines()
    s = Summary.parse(lines[-1])
    assert (s.runs, s.ok, s.failed, s.mode, s.seed_base) == (3, 2, 1, "auto", "cli")
    (repro_line,) = [ln for ln in lines if ln.startswith("REPRO ") and "(exact)" not in ln]
    argv = shlex.split(repro_line.split(": ", 1)[1])
    assert argv[:2] == ["durable-spaces", "repro"]
    # the printed command fails again when run
    again = runner.invoke(cli.app, [*argv[1:], "--state-dir", str(tmp_path / "r")])
    assert again.exit_code == 1, again.output
    assert again.stdout.strip().splitlines()[-1] == (
        "RESULT seed=cli-1 outcome=failed failing=exactly_once"
    )
    assert (out / "report.md").exists() and (out / "report.html").exists()
    # the campaign refuses to mix into a used directory
    r2 = runner.invoke(cli.app, ["campaign", "--out", str(out), "--no-progress"])
    assert r2.exit_code == 2 and "--force" in r2.stderr


def test_exhaustive_campaign_uses_the_sessions_schedules(toy_session: None, tmp_path: Path) -> None:
    r = runner.invoke(
        cli.app,
        [
            "campaign",
            "--mode",
            "exhaustive",
            "--calls",
            "2",
            "--seed-base",
            "ex",
            "--out",
            str(tmp_path / "x"),
            "--no-progress",
            "--no-report",
            "--jobs",
            "2",
        ],
    )
    assert r.exit_code == 1
    s = Summary.parse(r.stdout.strip().splitlines()[-1])
    assert (s.runs, s.failed, s.kills) == (4, 2, 4)  # call 1, commit 1, call 2, commit 2
    repros = [ln for ln in r.stdout.splitlines() if ln.startswith("REPRO") and "(exact)" not in ln]
    assert all("--schedule" in ln for ln in repros)
    argv = shlex.split(repros[0].split(": ", 1)[1])
    again = runner.invoke(cli.app, [*argv[1:], "--state-dir", str(tmp_path / "r")])
    assert again.exit_code == 1, again.output


def test_bad_env_names_the_variable(toy_session: None, tmp_path: Path) -> None:
    r = runner.invoke(cli.app, ["campaign", "--out", str(tmp_path)], env={"CRASH_CALLS": "x"})
    assert r.exit_code == 2 and "CRASH_CALLS" in r.stderr


def test_missing_session_module_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cli.campaigns, "SESSION_MODULE", "durable_spaces.campaigns.no_such_session")
    r = runner.invoke(cli.app, ["repro", "--seed", "s-1", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "not part of this build" in r.stderr


def test_report_command(tmp_path: Path) -> None:
    assert runner.invoke(cli.app, ["report", str(tmp_path)]).exit_code == 2
    (tmp_path / "runs").mkdir()
    r = runner.invoke(cli.app, ["report", str(tmp_path)])  # no record: no report
    assert r.exit_code == 1 and not (tmp_path / "report.html").exists()
    RunRecord("run-0000", "s-0", "transactional", "local", 2).save(tmp_path / "runs")
    r = runner.invoke(cli.app, ["report", str(tmp_path)])
    assert r.exit_code == 0 and (tmp_path / "report.html").exists()
