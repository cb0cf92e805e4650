"""Checkpoint mode records the checkpoint after a call in the call's result commit
(``CheckpointKeeper.take`` with ``with_result``): the log says nothing of it before the
result entry, and says it with that entry, atomically; a prune in between never takes
the checkpoint whose record is on its way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tool_session import tool_session

from durable_spaces.adapter.checkpoints.incremental import copy_dir
from durable_spaces.adapter.space_state import DOC


def _doc_puts(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [op["value"] for op in ops if op.get("op") == "doc" and op.get("name") == DOC]


async def test_the_checkpoint_is_recorded_with_the_result_entry(tmp_path: Path) -> None:
    async with tool_session(tmp_path) as s:
        await s.call("bash", {"command": "echo one > a.txt"})
        before = len(s.harness.storage.load())
        await s.call("bash", {"command": "echo two >> a.txt"})
        commits = s.harness.storage.load()[before:]
        cid = s.state().calls["c2"].checkpoint
        assert cid is not None and s.state().last_checkpoint == cid
        # The start mark, the outcome, the result: one commit fewer than a record of
        # its own would take.
        assert len(commits) == 3, [c.ops for c in commits]
        *earlier, result = commits
        assert [op["kind"] for op in result.ops if op.get("op") == "entry"] == ["tool_result"]
        (doc,) = _doc_puts(result.ops)
        assert doc["last_checkpoint"] == cid and doc["calls"]["c2"]["checkpoint"] == cid
        assert doc["calls"]["c2"]["result_entry"] == result.ops[0]["id"]
        for c in earlier:  # nothing before the result says the new checkpoint is there
            assert all(cid not in repr(d) for d in _doc_puts(c.ops))


async def test_a_prune_keeps_the_checkpoint_whose_record_is_on_its_way(tmp_path: Path) -> None:
    """Every call prunes the Space's copy (at once, no backlog) between its checkpoint
    and the result commit that records it: the copy must still hold that checkpoint,
    while an unrecorded one planted before the call is gone (the prune did run)."""
    async with tool_session(tmp_path) as s:
        s.snaps.prune_every, s.snaps.backlog = 1, 0
        await s.call("bash", {"command": "echo 0 >> a.txt"})
        for n in range(1, 4):
            await s.snaps.settle()
            planted = Path(copy_dir(s.space)) / f"gone{n}-m{'0' * 64}.manifest"
            planted.write_bytes(b"an unrecorded checkpoint")
            await s.call("bash", {"command": f"echo {n} >> a.txt"})
            await s.snaps.settle()
            last = s.state().last_checkpoint
            assert last is not None
            held = os.listdir(copy_dir(s.space))
            assert f"{last}.manifest" in held, (last, held)
            assert planted.name not in held, held
