"""Bad arguments to the ``durable-spaces`` command: each ends in one line
``durable-spaces: error: ...`` and exit 2 (or 1), never a traceback, never a hang, and
creates nothing (no campaign directory, no state directory, no backend directory).
Printed repro commands quote every value."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from tree_snapshot import tree
from typer.testing import CliRunner

from durable_spaces import cli
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.spec import LabSettings, RunSpec
from durable_spaces.chaos.schedule import AttemptPlan, Failpoint, Schedule
from durable_spaces.settings import Settings, parse_switch

runner = CliRunner()


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory (where a default campaigns-out/ would appear)."""
    d = tmp_path / "cwd"
    d.mkdir()
    monkeypatch.chdir(d)
    for var in [v for v in os.environ if v.startswith("CRASH_")]:
        monkeypatch.delenv(var)
    # a check that lets bad input through fails fast here instead of running a campaign
    monkeypatch.setattr(cli.campaigns, "SESSION_MODULE", "durable_spaces.campaigns.no_such_session")
    return d


def _refused(args: list[str], root: Path, code: int = 2, env: dict[str, str] | None = None) -> str:
    """Run the CLI; assert one error line, ``code``, no exception, nothing created."""
    before = tree(root)
    r = runner.invoke(cli.app, args, env=env)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == code, (r.exit_code, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    assert len(lines) == 1 and lines[0].startswith("durable-spaces: error: "), r.stderr
    assert tree(root) == before
    return lines[0]


# --- campaign ----------------------------------------------------------------------------

CAMPAIGN = {
    "calls-zero": (["--calls", "0"], "at least 1"),
    "calls-negative": (["--calls", "-4"], "at least 1"),
    "calls-over-cap": (["--calls", "10001"], "over the limit of 10000"),
    "calls-absurd": (["--calls", "9" * 30], "over the limit"),
    "calls-not-int": (["--calls", "many"], "'--calls'"),
    "runs-zero": (["--runs", "0"], "at least 1"),
    "runs-negative": (["--runs", "-1"], "at least 1"),
    "runs-over-cap": (["--runs", "1000000"], "over the limit of 10000"),
    "jobs-zero": (["--jobs", "0"], "at least 1"),
    "jobs-huge": (["--jobs", "100000"], "over the limit of 256"),
    "seed-base-empty": (["--seed-base", ""], "one word"),
    "seed-base-blank": (["--seed-base", "   "], "one word"),
    "seed-base-space": (["--seed-base", "a b"], "one word"),
    "seed-base-path": (["--seed-base", "../../etc"], "one word"),
    "seed-base-shell": (["--seed-base", "x;rm -rf ~"], "one word"),
    "seed-base-subst": (["--seed-base", "$(id)"], "one word"),
    "seed-base-quote": (["--seed-base", "it's"], "one word"),
    "seed-base-long": (["--seed-base", "s" * 200], "one word"),
    "mode-unknown": (["--mode", "chaotic"], "transactional, auto, checkpoint"),
    "backend-unknown": (["--backend", "vmware"], "local, spacesd, docker, microvm"),
    "profile-unknown": (["--profile", "brutal"], "default"),
    "durable-mode-unknown": (["--durable-mode", "maybe"], "transactional, checkpoint, auto"),
    "run-timeout-zero": (["--run-timeout", "0"], "--run-timeout"),
    "run-timeout-inf": (["--run-timeout", "inf"], "--run-timeout"),
    "run-timeout-nan": (["--run-timeout", "nan"], "--run-timeout"),
    "unknown-option": (["--frobnicate"], "No such option"),
}


@pytest.mark.parametrize(("args", "why"), CAMPAIGN.values(), ids=CAMPAIGN.keys())
def test_a_bad_campaign_argument_is_one_line_and_creates_nothing(
    args: list[str], why: str, cwd: Path, tmp_path: Path
) -> None:
    line = _refused(["campaign", "--out", str(tmp_path / "c"), "--no-progress", *args], tmp_path)
    assert why in line


BAD_ENV = {
    "CRASH_CALLS-fullwidth": ("CRASH_CALLS", "\uff15"),
    "CRASH_RUNS-underscore": ("CRASH_RUNS", "1_0"),
    "CRASH_JOBS-float": ("CRASH_JOBS", "2.5"),
    "CRASH_SEED_BASE-slash": ("CRASH_SEED_BASE", "a/b"),
    "CRASH_MODE-unknown": ("CRASH_MODE", "nope"),
}


@pytest.mark.parametrize(("var", "value"), BAD_ENV.values(), ids=BAD_ENV.keys())
def test_a_bad_crash_variable_names_itself(var: str, value: str, cwd: Path, tmp_path: Path) -> None:
    line = _refused(["campaign", "--out", str(tmp_path / "c")], tmp_path, env={var: value})
    assert var in line


@pytest.mark.parametrize("what", ["a-file", "under-a-file", "runs-is-a-file"])
def test_an_unusable_out_is_refused(what: str, cwd: Path, tmp_path: Path) -> None:
    f = tmp_path / "taken"
    f.write_text("not a directory\n")
    if what == "a-file":
        out = f
    elif what == "under-a-file":
        out = f / "c"
    else:
        out = tmp_path / "c"
        out.mkdir()
        (out / "runs").write_text("x")
    line = _refused(["campaign", "--out", str(out), "--no-progress"], tmp_path)
    assert "--out" in line or "runs" in line


def test_an_unwritable_out_is_refused(cwd: Path, tmp_path: Path) -> None:
    """Read-only even for root: the CLI run in a private mount namespace."""
    import shutil

    ro = tmp_path / "ro"
    ro.mkdir()
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    cmd = [sys.executable, "-m", "durable_spaces.cli", "campaign", "--out", str(ro / "c")]
    if os.geteuid() != 0:
        ro.chmod(0o500)
        argv = cmd
    elif (
        shutil.which("unshare")
        and subprocess.run(
            ["unshare", "-m", "sh", "-c", script, "sh", str(ro), "true"], capture_output=True
        ).returncode
        == 0
    ):
        argv = ["unshare", "-m", "sh", "-c", script, "sh", str(ro), *cmd]
    else:
        pytest.skip("needs unshare -m and mount (a private read-only bind mount) as root")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd)
    ro.chmod(0o755)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert (
        p.stderr.strip().startswith("durable-spaces: error: --out")
        and len(p.stderr.strip().splitlines()) == 1
    ), p.stderr
    assert list(ro.iterdir()) == []


# --- repro ---------------------------------------------------------------------------------

BAD_SEEDS = {
    "empty": "",
    "blank": "  ",
    "space": "ds 1",
    "path": "../../x",
    "subst": "$(touch pwned)",
    "newline": "ds\n1",
    "quote": "ds'1",
    "glob": "ds-*",
}


@pytest.mark.parametrize("seed", BAD_SEEDS.values(), ids=BAD_SEEDS.keys())
def test_repro_with_a_malformed_seed_is_refused(seed: str, cwd: Path, tmp_path: Path) -> None:
    line = _refused(["repro", "--seed", seed], tmp_path)
    assert "--seed" in line
    assert not (cwd / "campaigns-out").exists() and not (cwd / "pwned").exists()


SCHEDULES = {
    "not-json": b"{not json",
    "a-list": b"[1, 2]",
    "no-seed": b'{"attempts": []}',
    "bad-attempt": b'{"seed": "s-1", "attempts": [{"failpoint": {"name": "x"}}]}',
    "unsafe-seed": b'{"seed": "../x", "attempts": []}',
    "binary": b"\xff\xfe\x00",
}


@pytest.mark.parametrize("data", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_repro_with_a_bad_schedule_file_is_refused(data: bytes, cwd: Path, tmp_path: Path) -> None:
    f = tmp_path / "sched.json"
    f.write_bytes(data)
    line = _refused(["repro", "--seed", "s-1", "--schedule", str(f)], tmp_path)
    assert "--schedule" in line


@pytest.mark.parametrize("what", ["missing", "directory", "endless"])
def test_repro_with_a_schedule_that_is_not_a_file_does_not_hang(
    what: str, cwd: Path, tmp_path: Path
) -> None:
    path = {"missing": tmp_path / "nope.json", "directory": tmp_path, "endless": Path("/dev/zero")}
    line = _refused(["repro", "--seed", "s-1", "--schedule", str(path[what])], tmp_path)
    assert "--schedule" in line


def test_repro_with_a_state_dir_that_is_a_file_is_refused(cwd: Path, tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    line = _refused(["repro", "--seed", "s-1", "--state-dir", str(f)], tmp_path)
    assert "--state-dir" in line


def test_repro_with_zero_calls_is_refused(cwd: Path, tmp_path: Path) -> None:
    line = _refused(["repro", "--seed", "s-1", "--calls", "0"], tmp_path)
    assert "--calls" in line


# --- report ---------------------------------------------------------------------------------


@pytest.mark.parametrize("what", ["missing", "a-file", "empty-dir", "runs-is-a-file"])
def test_report_of_something_that_is_not_a_campaign_is_refused(
    what: str, cwd: Path, tmp_path: Path
) -> None:
    d = tmp_path / "c"
    if what == "a-file":
        d.write_text("x")
    elif what == "empty-dir":
        d.mkdir()
    elif what == "runs-is-a-file":
        d.mkdir()
        (d / "runs").write_text("x")
    line = _refused(["report", str(d)], tmp_path)
    assert str(d) in line


@pytest.mark.parametrize("files", [0, 1, 3])
def test_report_where_no_record_can_be_read_fails_and_writes_nothing(
    files: int, cwd: Path, tmp_path: Path
) -> None:
    """It wrote an empty report and exited 0, as if the campaign had run nothing."""
    runs = tmp_path / "c" / "runs"
    runs.mkdir(parents=True)
    for i in range(files):
        (runs / f"run-{i:04d}.json").write_bytes(b"\x00 not a record")
    line = _refused(["report", str(tmp_path / "c")], tmp_path, code=1)
    assert "no run record could be read" in line and "no report written" in line
    assert f"of {files} file(s)" in line


def test_report_skips_garbage_records_with_one_warning_each(cwd: Path, tmp_path: Path) -> None:
    d = tmp_path / "c"
    runs = d / "runs"
    RunRecord("run-0000", "s-0", "transactional", "local", 2).save(runs)
    good = RunRecord("run-0001", "s-1", "transactional", "local", 2, outcome="failed")
    good.repro = "durable-spaces repro --seed s-1"
    good.save(runs)
    (runs / "run-0002.json").write_bytes(b'{"run_id": "run-0002", "seed": "s-2", "mo')  # truncated
    (runs / "run-0003.json").write_bytes(b"\x00\x01garbage")
    (runs / "run-0004.json").write_text(json.dumps({"run_id": "run-0004", "calls": "two"}))
    r = runner.invoke(cli.app, ["report", str(d)])
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("durable-spaces: warning:")]
    for n in (2, 3, 4):
        assert sum(f"run-000{n}.json" in w for w in warnings) == 1, warnings
    assert "skipped 3 of 5 run records" in warnings[-1]
    md = (d / "report.md").read_text()
    assert "run-0001" in md and "## Skipped files" in md and "run-0004.json" in md


# --- diff ------------------------------------------------------------------------------------


@pytest.fixture
def session_dir(tmp_path: Path) -> Path:
    from durable_spaces.harness.log import SqliteStorage

    d = tmp_path / "session"
    d.mkdir()
    SqliteStorage(d / "log.sqlite").close()
    return d


DIFF = {
    "entry-not-an-id": (["x12", "e2"], "ENTRY_A"),
    "entry-zero": (["e1", "e0"], "ENTRY_B"),
    "entry-empty": (["", "e2"], "ENTRY_A"),
    "entry-path": (["e1", "../e2"], "ENTRY_B"),
    "backend-unknown": (["e1", "e2", "--backend", "vmware"], "local, spacesd"),
    "backend-dir-missing": (["e1", "e2", "--backend-dir", "/no/such/dir"], "--backend-dir"),
    "store-not-a-dir": (["e1", "e2", "--store", "/etc/hostname"], "--store"),
    "conversation-bad": (["e1", "e2", "--conversation", "c-1"], "--conversation"),
}


@pytest.mark.parametrize(("args", "why"), DIFF.values(), ids=DIFF.keys())
def test_diff_with_bad_arguments_is_refused(
    args: list[str], why: str, cwd: Path, session_dir: Path, tmp_path: Path
) -> None:
    line = _refused(["diff", str(session_dir), *args], tmp_path)
    assert why in line
    assert not Path("/no/such/dir").exists()


@pytest.mark.parametrize("what", ["missing", "a-file", "no-log", "log-is-a-symlink"])
def test_diff_of_something_that_is_not_a_session_is_refused(
    what: str, cwd: Path, tmp_path: Path, outside: Path
) -> None:
    d = tmp_path / "s"
    if what == "a-file":
        d.write_text("x")
    elif what == "no-log":
        d.mkdir()
    elif what == "log-is-a-symlink":
        d.mkdir()
        (d / "log.sqlite").symlink_to(outside / "precious")
    line = _refused(["diff", str(d), "e1", "e2"], tmp_path)
    assert "STATE_DIR" in line


def test_diff_of_a_foreign_database_is_one_line_exit_1(cwd: Path, tmp_path: Path) -> None:
    import sqlite3

    d = tmp_path / "s"
    d.mkdir()
    c = sqlite3.connect(d / "log.sqlite")
    c.execute("CREATE TABLE users (x)")
    c.commit()
    c.close()
    (tmp_path / "spaces").mkdir()
    line = _refused(
        [
            "diff",
            str(d),
            "e1",
            "e2",
            "--backend",
            "local",
            "--backend-dir",
            str(tmp_path / "spaces"),
        ],
        tmp_path,
        code=1,
    )
    assert "not a durable-spaces log" in line


# --- the real entry point, and what is printed back -------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["campaign", "--calls", "0"], ["repro"], ["report"], ["frobnicate"], ["diff", "x"]],
    ids=["bad-value", "missing-option", "missing-argument", "unknown-command", "missing-args"],
)
def test_the_installed_entry_point_prints_one_line(args: list[str], cwd: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "durable_spaces.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("durable-spaces: error: "), p.stderr
    assert list(cwd.iterdir()) == []


def test_no_arguments_still_prints_the_help(cwd: Path) -> None:
    r = runner.invoke(cli.app, [])
    assert "campaign" in r.output and "Usage" in r.output


WEIRD = {
    "mode": "transactional",
    "seed": "ds-adapter.call-3",
    "schedule": "/tmp/my schedules/it's $(here).json",
}


def test_a_repro_line_quotes_every_value_and_round_trips() -> None:
    sched = Schedule(WEIRD["seed"], (AttemptPlan(failpoint=Failpoint("adapter.call", 3)),))
    spec = RunSpec("run-0001", WEIRD["seed"], "auto", "local", 4, "checkpoint", "space",
                   schedule=sched)  # fmt: skip
    line = spec.repro(WEIRD["schedule"])
    argv = shlex.split(line)
    assert argv == [
        "durable-spaces", "repro", "--mode", "auto", "--backend", "local", "--seed",
        WEIRD["seed"], "--calls", "4", "--durable-mode", "checkpoint", "--profile", "space",
        "--schedule", WEIRD["schedule"],
    ]  # fmt: skip
    assert shlex.quote(WEIRD["schedule"]) in line


#: Every on/off switch, the product's and the lab's.
SWITCHES = [
    f.metadata["env"]
    for cls in (Settings, LabSettings)
    for f in fields(cls)
    if f.metadata["parse"] is parse_switch
]


@pytest.mark.parametrize("name", SWITCHES)
@pytest.mark.parametrize("value", ["off", "true", "", "2"])
def test_a_malformed_switch_is_refused_before_any_work(
    name: str, value: str, cwd: Path, tmp_path: Path
) -> None:
    """``DS_WARM_DRIVERS=off`` and the like used to leave the feature on without a word
    (anything but ``0`` was "on"); now every command refuses it in one line."""
    line = _refused(["campaign", "--out", str(tmp_path / "c")], tmp_path, code=1, env={name: value})
    assert name in line and "0 (off) or 1 (on)" in line


# --- repro --exact: a run record is checked exactly as the flags are ----------------------


def _exact_record(**changes: object) -> dict[str, object]:
    """A record ``repro --exact`` would replay, with ``changes`` (``extra.*`` and
    ``interleaving.*`` keys go into its extra and its one realized fault)."""
    fault = {"type": "ok", "attempt": 0, "kind": "space_remove", "at": {"point": "*", "n": 5},
             "value": {}}  # fmt: skip
    extra: dict[str, object] = {"profile": "default", "env": {}, "interleaving": [fault]}
    sched = Schedule("s-1", (AttemptPlan(Failpoint("adapter.spawn", 1)),))
    rec = RunRecord("run-0001", "s-1", "transactional", "local", 3, schedule=sched.to_json())
    d = rec.to_json()
    for k, v in changes.items():
        if k.startswith("extra."):
            extra[k.removeprefix("extra.")] = v
        elif k.startswith("interleaving."):
            fault[k.removeprefix("interleaving.")] = v
        else:
            d[k] = v
    d["extra"] = extra
    return d


EXACT = {
    # every field a flag also gives, out of range or of the wrong kind: the flag's words
    "calls-absurd": ({"calls": 10**9}, "--calls/CRASH_CALLS=1000000000 is over the limit of 10000"),
    "calls-over-cap": ({"calls": 10001}, "over the limit of 10000"),
    "calls-zero": ({"calls": 0}, "at least 1"),
    "mode-unknown": ({"mode": "chaotic"}, "transactional, auto, checkpoint"),
    "backend-unknown": ({"backend": "vmware"}, "local, spacesd, docker, microvm"),
    "durable-mode-unknown": ({"durable_mode": "maybe"}, "transactional, checkpoint, auto"),
    "scenario-unknown": ({"scenario": "chaos"}, "--scenario"),
    "profile-unknown": ({"extra.profile": "brutal"}, "--profile"),
    "profile-a-number": ({"extra.profile": 7}, "--profile"),
    "profile-on-the-wrong-backend": ({"extra.profile": "space-journal"}, "--backend"),
    "scenario-on-the-wrong-backend": ({"scenario": "server"}, "--backend"),
    "seed-a-path": ({"seed": "../../x"}, "one word"),
    "seed-a-shell": ({"seed": "s;rm -rf ~"}, "one word"),
    # the environment it carries, as this shell's is checked
    "env-mutant-unknown": ({"extra.env": {"DS_MUTANTS": "nope"}}, "unknown mutants nope"),
    "env-mutant-among-good": ({"extra.env": {"DS_MUTANTS": "rerun_exited,nope"}}, "nope"),
    "env-switch-bad": ({"extra.env": {"DS_WARM_DRIVERS": "2"}}, "DS_WARM_DRIVERS"),
    "env-log-format": ({"extra.env": {"DS_LOG_FORMAT": "xml"}}, "sqlite or jsonl"),
    "env-log-level": ({"extra.env": {"DS_LOG_SYNCHRONOUS": "EXTRA"}}, "NORMAL or FULL"),
    "env-unknown-name": ({"extra.env": {"LD_PRELOAD": "x.so"}}, "LD_PRELOAD"),
    "env-a-list": ({"extra.env": ["DS_MUTANTS"]}, "not a mapping"),
    # the schedule and the interleaving it replays
    "attempt-absurd": ({"interleaving.attempt": 10**9}, "attempt 1000000000"),
    "attempt-negative": ({"interleaving.attempt": -1}, "attempt -1"),
    "attempt-a-string": ({"interleaving.attempt": "0"}, "attempt '0'"),
    "hit-absurd": ({"interleaving.at": {"point": "*", "n": 10**12}}, "hit number"),
    "hit-zero": ({"interleaving.at": {"point": "*", "n": 0}}, ">= 1"),
    "hit-a-word": ({"interleaving.at": {"point": "*", "n": "five"}}, "five"),
    "at-a-string": ({"interleaving.at": "adapter.spawn"}, "at is not an object"),
    "kind-unknown": ({"interleaving.kind": "meteor"}, "meteor"),
    "point-with-a-comma": ({"interleaving.at": {"point": "a,b", "n": 1}}, "point's name"),
    "duration-nan": (
        {"interleaving.kind": "space_pause", "interleaving.value": {"duration_s": float("nan")}},
        "nan",
    ),
    "duration-negative": (
        {"interleaving.kind": "space_pause", "interleaving.value": {"duration_s": -3}},
        "-3",
    ),
    "interleaving-entry-a-list": ({"extra.interleaving": [[1]]}, "not an object"),
    "schedule-too-many-attempts": (
        {"schedule": {"seed": "s-1", "attempts": [{}] * 2000}},
        "2000 attempts",
    ),
    "schedule-kill-never": (
        {"schedule": {"seed": "s-1", "attempts": [{"kill_after_s": [1e300]}]}},
        "kill_after_s",
    ),
    "schedule-failpoint-hit-zero": (
        {
            "schedule": {
                "seed": "s-1",
                "attempts": [{"failpoint": {"name": "adapter.spawn", "n": 0}}],
            }
        },
        "failpoint n",
    ),
    "schedule-not-one": ({"schedule": {"attempts": []}}, "seed"),
}


@pytest.mark.parametrize(("changes", "why"), EXACT.values(), ids=EXACT.keys())
def test_repro_exact_checks_a_record_as_the_flags_are(
    changes: dict[str, object], why: str, cwd: Path, tmp_path: Path
) -> None:
    """A record's ``calls=10**9`` is refused as ``--calls 1000000000`` is, a record's
    ``DS_MUTANTS=nope`` as this shell's is: one line, nothing made, nothing run."""
    f = tmp_path / "run-0001.json"
    f.write_text(json.dumps(_exact_record(**changes)))
    line = _refused(["repro", "--exact", str(f)], tmp_path)
    assert f"--exact {f}" in line and why in line, line


def test_repro_exact_of_a_good_record_gets_as_far_as_the_session(cwd: Path, tmp_path: Path) -> None:
    """The control: the base record of the cases above passes every check (and stops
    only at the session module the fixture hides)."""
    f = tmp_path / "run-0001.json"
    f.write_text(json.dumps(_exact_record()))
    r = runner.invoke(cli.app, ["repro", "--exact", str(f)])
    assert r.exit_code == 2 and "campaign session" in r.stderr, r.output


@pytest.mark.parametrize("command", [["campaign", "--runs", "1"], ["repro", "--seed", "s-1"]])
@pytest.mark.parametrize(
    ("var", "value"),
    [("DS_MUTANTS", "nope"), ("DS_LOG_FORMAT", "xml"), ("DS_LOG_SYNCHRONOUS", "EXTRA")],
)
def test_the_environment_is_checked_as_a_record_s_is(
    command: list[str], var: str, value: str, cwd: Path, tmp_path: Path
) -> None:
    line = _refused(command, tmp_path, code=1, env={var: value})  # as every DS_* setting
    assert var in line
