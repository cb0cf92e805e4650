"""``CheckpointKeeper.begin``: in checkpoint mode the checkpoint after a call starts
while the call's outcome commits (the Space is the same either side of that commit), so
its work on the host overlaps the log's fsync. The outcome is still committed before the
checkpoint is recorded (with the call's result); a commit that fails leaves nothing of the
checkpoint running and nothing of it recorded; ``DS_CHECKPOINT_EARLY=0`` keeps the old
order."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tool_session import ToolSession, tool_session

from durable_spaces.adapter.checkpoints import incremental
from durable_spaces.harness.scheduler import Harness

COMMIT_S = 0.15  # each commit of the log made this slow (a slow disk under the log)


@dataclass
class Timeline:
    """When each commit of the log ran, and when each checkpoint's host part started and
    ended (monotonic seconds)."""

    commits: list[tuple[float, float]] = field(default_factory=list)
    syncs: list[tuple[float, float]] = field(default_factory=list)
    fail_commit: int | None = None  # this commit (1-based) raises, after its delay
    sync_delay: float = 0.0

    def overlapped(self) -> list[tuple[float, float]]:
        """The checkpoints whose host part started while a commit ran."""
        return [s for s in self.syncs if any(a < s[0] < b for a, b in self.commits)]


@dataclass
class Session(ToolSession):
    line: Timeline = field(default_factory=Timeline)


@asynccontextmanager
async def session(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Session]:
    line = Timeline()
    real_commit, real_sync = Harness.commit, incremental.Taker._host_sync

    async def commit(self: Harness, *a: Any, **k: Any) -> Any:
        t0 = time.monotonic()
        time.sleep(COMMIT_S)  # blocking, as the log's own fsync blocks the loop
        try:
            if line.fail_commit == len(line.commits) + 1:
                raise OSError(28, "No space left on device (the log's disk)")
            return await real_commit(self, *a, **k)
        finally:
            line.commits.append((t0, time.monotonic()))

    def host_sync(self: incremental.Taker, *a: Any) -> Any:
        t0 = time.monotonic()
        time.sleep(line.sync_delay)
        try:
            return real_sync(self, *a)
        finally:
            line.syncs.append((t0, time.monotonic()))

    monkeypatch.setattr(Harness, "commit", commit)
    monkeypatch.setattr(incremental.Taker, "_host_sync", host_sync)
    async with tool_session(tmp) as s:
        yield Session(s.harness, s.registry, s.conv, s.space, s.snaps, line=line)


@pytest.mark.parametrize("early", ["1", "0"])
async def test_the_checkpoint_runs_while_the_outcome_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, early: str
) -> None:
    monkeypatch.setenv("DS_CHECKPOINT_EARLY", early)
    async with session(tmp_path, monkeypatch) as s:
        await s.call("bash", {"command": "echo one > a.txt"})  # the first checkpoints
        line = s.line
        line.commits.clear()
        line.syncs.clear()
        await s.call("bash", {"command": "echo two > b.txt"})
        # Commits: the start mark, the outcome, the result with the checkpoint's record.
        assert len(line.syncs) == 1 and len(line.commits) == 3, line
        outcome, record = line.commits[1], line.commits[2]
        after = line.syncs[0]
        if early == "1":
            assert line.overlapped() == [after]
            assert outcome[0] < after[0] < outcome[1]
        else:
            assert line.overlapped() == []
            assert outcome[1] <= after[0]
        # Either way the checkpoint is recorded only once it is written.
        assert after[1] <= record[0]
        rec = s.state().calls["c2"]
        assert rec.outcome is not None and rec.checkpoint == s.state().last_checkpoint


async def test_an_outcome_commit_that_fails_leaves_no_checkpoint_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DS_CHECKPOINT_EARLY", "1")
    async with session(tmp_path, monkeypatch) as s:
        await s.call("bash", {"command": "echo one > a.txt"})
        before = s.state()
        s.line.fail_commit = len(s.line.commits) + 2  # the next call's outcome commit
        s.line.sync_delay = 0.3  # a checkpoint that outlasts the failing commit
        with pytest.raises(OSError, match="No space left"):
            await s.call("bash", {"command": "echo two > b.txt"})
        # Ended before the call did: no thread of it runs on once the call failed.
        assert len(s.line.syncs) == 3, s.line
        after = s.state()
        # Nothing of it is recorded: the log holds the state before the failed call.
        assert after.last_checkpoint == before.last_checkpoint
        assert after.calls["c2"].outcome is None and after.calls["c2"].checkpoint is None
