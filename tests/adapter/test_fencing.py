"""Fencing of a stale driver: an older driver can neither add to the log nor run
a command once a newer one took over, and it exits 75; a Space that cannot be fenced
halts the driver without recording anything."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from drive import (
    AGENT,
    HANG_S,
    check,
    cleanup,
    driver_env,
    gate_of,
    gate_opened_at,
    setup,
    wait_for_point,
)
from needs import need

from durable_spaces.harness.log import SqliteStorage


def _env(tmp: Path, epoch: int) -> dict[str, str]:
    return driver_env(tmp, epoch, heartbeat=1)


def _start(tmp: Path, epoch: int) -> subprocess.Popen[str]:
    """A driver at ``epoch`` that traces its failpoints to ``tmp/trace-<epoch>``."""
    env = _env(tmp, epoch)
    env["DS_FAILPOINT_TRACE"] = str(tmp / f"trace-{epoch}")
    return subprocess.Popen(
        AGENT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _end(p: subprocess.Popen[str]) -> None:
    """A driver a failed test left running is killed, not left behind."""
    if p.poll() is None:
        p.kill()
        p.communicate()


@pytest.mark.parametrize("backend", ["local", pytest.param("spacesd", marks=pytest.mark.spacesd)])
def test_older_driver_is_fenced_and_exits_75(tmp_path: Path, backend: str) -> None:
    need(backend)
    # Shell steps hold on the gate: the old driver is surely mid-command when the new one
    # starts, and the gate opens once the new one has taken the Space over.
    setup(tmp_path, backend, "transactional", calls=4, seed="1", sleep=0.0, gate=True)
    old = _start(tmp_path, 1)
    try:
        wait_for_point(tmp_path / "trace-1", "adapter.spawn 1", old)  # its first command
        with gate_opened_at(tmp_path, tmp_path / "trace-2", "recovery.start 1"):
            new = _start(tmp_path, 2)
            try:
                _, new_err = new.communicate(timeout=HANG_S)
            finally:
                _end(new)
        _, old_err = old.communicate(timeout=HANG_S)
        assert new.returncode == 0, new_err[-2000:]
        assert old.returncode == 75, f"old driver exited {old.returncode}: {old_err[-2000:]}"
        storage = SqliteStorage(tmp_path / "state" / "log.sqlite", exclusive=False)
        commits = storage.load()
        storage.close()
        first_new = next(c.seq for c in commits if c.epoch == 2)
        assert all(c.epoch == 2 for c in commits if c.seq > first_new), "a stale commit landed"
        verdicts = asyncio.run(check(tmp_path, backend))
        bad = {k: v for k, v in verdicts.items() if v.get("valid") is not True}
        assert not bad, bad
        # The old driver's command was killed, not allowed to finish: every journal line
        # is one of the committed steps (exactly_once above), and the new driver reran it.
    finally:
        _end(old)
        asyncio.run(cleanup(tmp_path, backend))


def test_driver_with_a_bad_environment_exits_78(tmp_path: Path) -> None:
    setup(tmp_path, "local", "transactional", calls=1)
    env = _env(tmp_path, 1)
    env["CUA_SESSION_EPOCH"] = "soon"
    p = subprocess.run(AGENT, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 78
    assert "CUA_SESSION_EPOCH" in p.stderr


def test_space_removed_under_a_live_driver_halts_without_recording(tmp_path: Path) -> None:
    # The driver's first command holds on the gate: surely running when its Space
    # vanishes. The gate opens after, so that a driver that went on would end, not hang.
    setup(tmp_path, "local", "transactional", calls=4, seed="1", sleep=0.0, gate=True)
    p = _start(tmp_path, 1)
    try:
        wait_for_point(tmp_path / "trace-1", "adapter.spawn 1", p)
        asyncio.run(cleanup(tmp_path, "local"))  # the Space vanishes mid-command
        gate_of(tmp_path).touch()
        p.communicate(timeout=HANG_S)
    finally:
        _end(p)
    assert p.returncode == 1, (
        "a vanished Space must halt the driver (resume later), not be recorded"
    )
    storage = SqliteStorage(tmp_path / "state" / "log.sqlite", exclusive=False)
    ops = [op for c in storage.load() for op in c.ops]
    storage.close()
    results = [op for op in ops if op.get("op") == "entry" and op.get("kind") == "tool_result"]
    assert all(r["data"]["status"] != "error" for r in results), results
