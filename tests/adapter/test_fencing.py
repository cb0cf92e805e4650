"""Fencing of a stale driver: an older driver can neither add to the log nor run
a command once a newer one took over, and it exits 75; a Space that cannot be fenced
halts the driver without recording anything."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest
from drive import AGENT, check, cleanup, driver_env, setup
from needs import need

from durable_spaces.harness.log import SqliteStorage


def _env(tmp: Path, epoch: int) -> dict[str, str]:
    return driver_env(tmp, epoch, heartbeat=1)


@pytest.mark.parametrize("backend", ["local", pytest.param("spacesd", marks=pytest.mark.spacesd)])
def test_older_driver_is_fenced_and_exits_75(tmp_path: Path, backend: str) -> None:
    need(backend)
    # Long shell steps: the old driver is surely mid-command when the new one starts.
    setup(tmp_path, backend, "transactional", calls=4, seed="1", sleep=2.0)
    old = subprocess.Popen(AGENT, env=_env(tmp_path, 1), stdout=subprocess.PIPE, text=True)
    assert old.stdout is not None
    for line in old.stdout:  # wait for its first wrapped call
        if "first_step" in line:
            break
    time.sleep(0.5)
    new = subprocess.run(AGENT, env=_env(tmp_path, 2), capture_output=True, text=True, timeout=120)
    old_code = old.wait(timeout=60)
    try:
        assert new.returncode == 0, new.stderr[-2000:]
        assert old_code == 75, f"old driver exited {old_code}"
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
        asyncio.run(cleanup(tmp_path, backend))


def test_driver_with_a_bad_environment_exits_78(tmp_path: Path) -> None:
    setup(tmp_path, "local", "transactional", calls=1)
    env = _env(tmp_path, 1)
    env["CUA_SESSION_EPOCH"] = "soon"
    p = subprocess.run(AGENT, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 78
    assert "CUA_SESSION_EPOCH" in p.stderr


def test_space_removed_under_a_live_driver_halts_without_recording(tmp_path: Path) -> None:
    setup(tmp_path, "local", "transactional", calls=4, seed="1", sleep=3.0)
    p = subprocess.Popen(AGENT, env=_env(tmp_path, 1), stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    for line in p.stdout:
        if "first_step" in line:
            break
    time.sleep(1.0)
    asyncio.run(cleanup(tmp_path, "local"))  # the Space vanishes mid-command
    code = p.wait(timeout=60)
    assert code == 1, "a vanished Space must halt the driver (resume later), not be recorded"
    storage = SqliteStorage(tmp_path / "state" / "log.sqlite", exclusive=False)
    ops = [op for c in storage.load() for op in c.ops]
    storage.close()
    results = [op for op in ops if op.get("op") == "entry" and op.get("kind") == "tool_result"]
    assert all(r["data"]["status"] != "error" for r in results), results
