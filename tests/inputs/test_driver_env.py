"""A driver given a bad ``CUA_SESSION_*`` environment: a real driver process (the
campaign's agent, as the coordinator launches it) exits 78 with one line on stderr
naming the variable, never a traceback or exit 1, and creates nothing anywhere: not in
the state directory (whose log is still whole and readable), not in its working
directory, not beside a symlink's target."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tree_snapshot import tree

from durable_spaces.adapter.durable import session_epoch
from durable_spaces.drive.entry import Session
from durable_spaces.errors import ConfigError
from durable_spaces.harness.log import SqliteStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adapter"))
from drive import AGENT, cleanup, driver_env, setup

BAD_EPOCH = {
    "beyond-int64": str(2**63),
    "huge": "9" * 40,
    "very-long": "1" * 5000,  # int() itself refuses beyond 4300 digits: still one clear line
    "negative": "-3",
    "zero": "0",
    "exponent": "1e3",
    "padded": " 5 ",
    "fullwidth-digit": "\uff15",
    "arabic-indic-digit": "\u0665",
    "underscore": "1_0",
    "hex": "0x10",
    "plus": "+5",
    "empty": "",
}
BAD_HEARTBEAT = {
    "inf": "inf",
    "nan": "nan",
    "zero": "0",
    "negative": "-1",
    "below-minimum": "0.001",
    "beyond-threading-max": "1e10",
    "overflows-float": "1e400",
    "padded": " 5",
    "word": "soon",
    "fullwidth-digit": "\uff15",
}
BAD_NAME: dict[str, str | bytes] = {
    "newline": "job\n42",
    "escape-sequence": "\x1b[31mred",
    "bidi-override": "job\u202e24",
    "very-long": "j" * 300,
    "blank": "   ",
    "padded": " job-42",
    "not-utf8": b"job\xff42",
}
BAD_SPACE = {
    "parent": "../elsewhere",
    "slash": "a/b",
    "space": "a b",
    "leading-dash": "-rm",
    "too-long": "s" * 200,
    "non-ascii": "sp\u00e4ce",
}
CASES: list[tuple[str, str, str | bytes]] = [
    *(("CUA_SESSION_EPOCH", k, v) for k, v in BAD_EPOCH.items()),
    *(("CUA_SESSION_HEARTBEAT_SECS", k, v) for k, v in BAD_HEARTBEAT.items()),
    *(("CUA_SESSION_NAME", k, v) for k, v in BAD_NAME.items()),
    *(("CUA_SESSION_SPACE", k, v) for k, v in BAD_SPACE.items()),
]


@pytest.fixture
def session(tmp_path: Path) -> Path:
    """A run's state dir with its agent.json and a log of one commit; a working dir."""
    setup(tmp_path, "local", "transactional", calls=1)
    s = SqliteStorage(tmp_path / "state" / "log.sqlite")
    s.append([{"kept": True}])
    s.close()
    (tmp_path / "cwd").mkdir()
    return tmp_path


def _run(tmp: Path, env: dict[str, str | bytes], argv: list[str] | None = None) -> tuple[int, str]:
    benv = {os.fsencode(k): v if isinstance(v, bytes) else os.fsencode(v) for k, v in env.items()}
    p = subprocess.run(
        argv or AGENT,
        env=benv,  # type: ignore[arg-type]
        cwd=tmp / "cwd",
        capture_output=True,
        text=True,
        timeout=120,
    )
    return p.returncode, p.stderr


def _assert_refused(code: int, stderr: str, var: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 78, stderr
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    assert var in lines[0] and "bad environment" in lines[0], lines[0]


def _log_intact(tmp: Path) -> None:
    s = SqliteStorage(tmp / "state" / "log.sqlite")
    try:
        assert [c.ops for c in s.load()] == [[{"kept": True}]]
    finally:
        s.close()


@pytest.mark.parametrize(
    ("var", "value"), [(v, x) for v, _, x in CASES], ids=[f"{v[12:]}-{k}" for v, k, _ in CASES]
)
def test_a_bad_variable_exits_78_naming_it_and_creates_nothing(
    var: str, value: str | bytes, session: Path
) -> None:
    env: dict[str, str | bytes] = dict(driver_env(session, 2))
    env[var] = value
    before = tree(session)
    code, stderr = _run(session, env)
    _assert_refused(code, stderr, var)
    assert tree(session) == before  # no Space dir, no log sidecars, nothing in cwd
    _log_intact(session)


def _ro_mount(directory: Path, argv: list[str]) -> list[str]:
    """``argv`` run where ``directory`` is read-only, even for root: a private mount
    namespace with a read-only bind mount of it."""
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh", str(directory), *argv]


def _ro_available(tmp: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = tmp / "probe"
    probe.mkdir()
    p = subprocess.run(_ro_mount(probe, ["true"]), capture_output=True, timeout=30)
    probe.rmdir()
    return p.returncode == 0


STATE_DIRS = ["a-file", "dangling-symlink", "relative", "missing-parent", "unset", "unwritable"]


@pytest.mark.parametrize("what", STATE_DIRS)
def test_a_bad_state_dir_exits_78_and_creates_nothing(
    what: str, session: Path, outside: Path
) -> None:
    env: dict[str, str | bytes] = dict(driver_env(session, 2))
    argv = None
    if what == "a-file":
        env["CUA_SESSION_STATE_DIR"] = str(session / "state" / "agent.json")
    elif what == "dangling-symlink":
        (session / "link").symlink_to(outside / "not-yet")
        env["CUA_SESSION_STATE_DIR"] = str(session / "link")
    elif what == "relative":
        env["CUA_SESSION_STATE_DIR"] = "state"  # would resolve against the driver's cwd
    elif what == "missing-parent":
        env["CUA_SESSION_STATE_DIR"] = str(session / "no" / "such" / "state")
    elif what == "unset":
        env.pop("CUA_SESSION_STATE_DIR")
    else:
        state = session / "state"
        if os.geteuid() != 0:
            state.chmod(0o500)
        elif _ro_available(session):
            argv = _ro_mount(state, AGENT)
        else:
            pytest.skip("needs unshare -m and mount (a private read-only bind mount) as root")
    before, before_outside = tree(session), tree(outside)
    code, stderr = _run(session, env, argv)
    (session / "state").chmod(0o755)
    _assert_refused(code, stderr, "CUA_SESSION_STATE_DIR")
    assert tree(session) == before and tree(outside) == before_outside
    _log_intact(session)


def test_a_missing_state_dir_in_an_existing_parent_is_made_0700_and_nothing_else(
    session: Path,
) -> None:
    """The one thing a driver creates for a valid environment before its log: the state
    dir's last component (here it then stops: that new dir holds no agent.json)."""
    env: dict[str, str | bytes] = dict(driver_env(session, 2))
    env["CUA_SESSION_STATE_DIR"] = str(session / "fresh")
    before = tree(session)
    code, stderr = _run(session, env)
    assert code == 78 and "agent.json is missing" in stderr and "Traceback" not in stderr
    after = tree(session)
    assert after.pop("fresh") == ("dir", 0o700, "") and after == before


def test_the_same_environment_when_valid_drives_the_session_to_done(tmp_path: Path) -> None:
    """The control: the harness above launches a driver that works."""
    setup(tmp_path, "local", "transactional", calls=1)
    (tmp_path / "cwd").mkdir()
    try:
        code, stderr = _run(tmp_path, dict(driver_env(tmp_path, 2)))
    finally:
        asyncio.run(cleanup(tmp_path, "local"))
    assert code == 0, stderr


# --- in process: what a real environment cannot even carry, and the library entry ------


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("CUA_SESSION_NAME", "job\x0042"),
        ("CUA_SESSION_STATE_DIR", "/tmp/st\x00ate"),
        ("CUA_SESSION_SPACE", "sp\x00ace"),
    ],
    ids=["name-nul", "state-dir-nul", "space-nul"],
)
def test_a_nul_byte_is_refused_by_from_env(var: str, value: str, tmp_path: Path) -> None:
    env = {k: v for k, v in driver_env(tmp_path, 2).items() if k.startswith("CUA_")}
    (tmp_path / "state").mkdir()
    env[var] = value
    with pytest.raises(ConfigError, match=var):
        Session.from_env(env)


@pytest.mark.parametrize("value", list(BAD_EPOCH.values())[:-1], ids=list(BAD_EPOCH)[:-1])
def test_session_epoch_reads_the_environment_as_strictly_as_the_driver(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUA_SESSION_EPOCH", value)
    with pytest.raises(ConfigError, match="CUA_SESSION_EPOCH"):
        session_epoch(None)


@pytest.mark.parametrize("epoch", [0, -1, 2**63, True], ids=["zero", "negative", "2**63", "bool"])
def test_session_epoch_refuses_an_explicit_epoch_a_log_cannot_hold(epoch: int) -> None:
    with pytest.raises(ConfigError, match="epoch"):
        session_epoch(epoch)


def test_the_extremes_that_are_valid_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    env = {k: v for k, v in driver_env(tmp_path, 2).items() if k.startswith("CUA_")}
    env.update(
        CUA_SESSION_EPOCH=str(2**63 - 1),
        CUA_SESSION_HEARTBEAT_SECS="0.01",
        CUA_SESSION_NAME="n" * 256,
        CUA_SESSION_SPACE="s" * 128,
    )
    s = Session.from_env(env)
    assert (s.epoch, s.heartbeat_secs, len(s.name), s.space) == (2**63 - 1, 0.01, 256, "s" * 128)
