"""Machine checkpoints are pruned by the log: after a run, exactly the checkpoints its
log records are left, including after a driver was killed between taking a checkpoint and
committing it (that checkpoint is recorded nowhere and must not stay: it holds the
guest's memory)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from needs import need

from durable_spaces.adapter.space_state import DOC, SpaceState
from durable_spaces.backends import open_backend
from durable_spaces.campaigns.checker import load_history
from tests.adapter.drive import Attempt, drive, setup

pytestmark = [pytest.mark.microvm, pytest.mark.slow]


def _recorded(tmp: Path) -> set[str]:
    history = load_history(str(tmp / "state" / "log.sqlite"))
    assert DOC in history.docs, "the run recorded no cua.space document"
    return SpaceState.from_json(history.docs[DOC]).checkpoints()


async def _on_disk(tmp: Path) -> list[str]:
    b = open_backend("microvm", tmp / "spaces")
    try:
        return list(await b.checkpoints())  # type: ignore[attr-defined]
    finally:
        await b.close()


def test_only_recorded_checkpoints_remain(tmp_path: Path) -> None:
    need("microvm")
    setup(tmp_path, "microvm", "checkpoint", calls=7, sleep=0.0, seed="3", snapshots="sandbox")
    o = drive(tmp_path, [Attempt("adapter.checkpoint:3"), Attempt()], backend="microvm")
    assert o.codes[-1] == 0, o.stderr
    assert o.valid, o.verdicts
    recorded = _recorded(tmp_path)
    on_disk = asyncio.run(_on_disk(tmp_path))
    # 7 calls + the one before the first + the one the kill left unrecorded were taken;
    # only the ones the log's newest state names are kept.
    assert set(on_disk) == recorded
    assert len(on_disk) < 9
