"""``durable-spaces quarantine list|restore`` refuse bad input in one line and create
nothing: a state directory that is not one, an unknown backend, a checkpoint that is not
an id (a path, a shell word), a target directory that holds anything (nothing is ever
overwritten), a checkpoint that is no quarantine of the log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from durable_spaces import cli
from durable_spaces.harness.log import SqliteStorage

runner = CliRunner()
GOOD_ID = "quarantine-m" + "a" * 64


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _refused(args: list[str], root: Path, code: int = 2) -> str:
    before = tree(root)
    r = runner.invoke(cli.app, args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == code, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    assert len(lines) == 1 and lines[0].startswith("durable-spaces: error: "), r.stderr
    assert tree(root) == before
    return lines[0]


@pytest.fixture
def session(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    SqliteStorage(d / "log.sqlite").close()
    (tmp_path / "spaces").mkdir()
    return d


def _where(tmp: Path) -> list[str]:
    return ["--backend", "local", "--backend-dir", str(tmp / "spaces")]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--backend", "vmware"], "local, spacesd"),
        (["--backend-dir", "/no/such/dir"], "--backend-dir"),
        (["--store", "/etc/hostname"], "--store"),
    ],
    ids=["backend", "backend-dir", "store"],
)
def test_list_with_bad_options_is_refused(
    args: list[str], why: str, session: Path, tmp_path: Path
) -> None:
    assert why in _refused(["quarantine", "list", str(session), *args], tmp_path)
    assert not Path("/no/such/dir").exists()


@pytest.mark.parametrize("what", ["missing", "a-file"])
def test_list_of_something_that_is_not_a_state_dir_is_refused(what: str, tmp_path: Path) -> None:
    d = tmp_path / "s"
    if what == "a-file":
        d.write_text("x")
    assert "STATE_DIR" in _refused(["quarantine", "list", str(d)], tmp_path)


def test_list_of_a_dir_without_a_log_fails_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "spaces").mkdir()
    line = _refused(["quarantine", "list", str(tmp_path / "s"), *_where(tmp_path)], tmp_path, 1)
    assert "no log at" in line


def test_list_of_a_log_without_quarantines_says_so(session: Path, tmp_path: Path) -> None:
    r = runner.invoke(cli.app, ["quarantine", "list", str(session), *_where(tmp_path)])
    assert r.exit_code == 0 and r.stdout.strip() == "no quarantine", r.output


@pytest.mark.parametrize("bad", ["../../etc/passwd", "$(id)", "x;rm -rf ~", "", "a" * 300])
def test_restore_of_something_that_is_not_a_checkpoint_id_is_refused(
    bad: str, session: Path, tmp_path: Path
) -> None:
    args = ["quarantine", "restore", str(session), bad, "--to", str(tmp_path / "out")]
    assert "CHECKPOINT" in _refused([*args, *_where(tmp_path)], tmp_path)


@pytest.mark.parametrize("what", ["not-empty", "a-file", "a-symlink"])
def test_restore_never_writes_into_anything_that_exists(
    what: str, session: Path, tmp_path: Path
) -> None:
    to = tmp_path / "out"
    if what == "not-empty":
        to.mkdir()
        (to / "precious").write_text("mine")
    elif what == "a-file":
        to.write_text("mine")
    else:
        os.symlink(tmp_path / "elsewhere", to)
    args = ["quarantine", "restore", str(session), GOOD_ID, "--to", str(to)]
    assert "--to" in _refused([*args, *_where(tmp_path)], tmp_path)


def test_restore_of_no_quarantine_of_the_log_fails_and_creates_nothing(
    session: Path, tmp_path: Path
) -> None:
    args = ["quarantine", "restore", str(session), GOOD_ID, "--to", str(tmp_path / "out")]
    line = _refused([*args, *_where(tmp_path)], tmp_path, 1)
    assert "no quarantine of the log" in line
