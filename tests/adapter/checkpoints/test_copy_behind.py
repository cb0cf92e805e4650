"""``copy_behind``: with a store, the Space's copy of a checkpoint is written after the
checkpoint returns. Made slow (a slow disk under ``.ds-checkpoints``), it must still be
complete before the next call changes the Space (so the checkpoint a recovery of that
call restores is in both copies), and before a restore, a prune or a read of the copies;
a write that fails must only warn, the store holding the checkpoint."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from tool_session import ToolSession, tool_session

from durable_spaces.adapter.checkpoints import copy_behind, inode_pool
from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.harness.tool_tasks import record_result
from durable_spaces.harness.tools import ToolContext

SLOW = 0.4  # seconds each copy write waits first
HANG_S = 300.0  # a wait for an event that takes this long is a hang, not a pace


class Session(ToolSession):
    def last_checkpoint(self) -> str:
        cid = self.state().last_checkpoint
        assert cid is not None
        return cid

    @property
    def copy(self) -> Path:
        return Path(self.space.root).parent / ".ds-checkpoints"


class HeldCopy:
    """The copy write of the checkpoint that holds ``path`` waits until the first
    ``settle`` after ``arm()`` (someone waits for it: it can finish only after being
    asked), or the end of the test; ``order`` says what came first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
        self.armed = False
        self.let_go = threading.Event()
        self.order: list[str] = []
        write, settle = copy_behind.CopyWrite.write, copy_behind.Behind.settle

        def held(w: copy_behind.CopyWrite, *a: Any) -> None:
            if path in w.manifest:
                self.let_go.wait(HANG_S)
            write(w, *a)
            if path in w.manifest:
                self.order.append("written")

        async def asked(b: copy_behind.Behind, space: str | None = None) -> None:
            if self.armed and not self.let_go.is_set():
                self.order.append("asked")
                self.let_go.set()
            await settle(b, space)

        monkeypatch.setattr(copy_behind.CopyWrite, "write", held)
        monkeypatch.setattr(copy_behind.Behind, "settle", asked)

    def arm(self) -> None:
        self.armed = True


@asynccontextmanager
async def held_copy(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> AsyncIterator[tuple[Session, HeldCopy]]:
    held = HeldCopy(monkeypatch, path)
    try:
        async with tool_session(tmp) as s:
            yield Session(s.harness, s.registry, s.conv, s.space, s.snaps), held
    finally:
        held.let_go.set()  # a test that failed leaves no write waiting


@asynccontextmanager
async def session(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Session]:
    real = copy_behind.CopyWrite.write

    def slow(self: copy_behind.CopyWrite, *a: Any) -> None:
        time.sleep(SLOW)  # a slow disk under the copy
        real(self, *a)

    monkeypatch.setattr(copy_behind.CopyWrite, "write", slow)
    async with tool_session(tmp) as s:
        yield Session(s.harness, s.registry, s.conv, s.space, s.snaps)


async def test_the_next_call_changes_the_space_only_once_the_copy_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with held_copy(tmp_path, monkeypatch, "a.txt") as (s, held):
        await s.call("bash", {"command": "echo one > a.txt"})
        cid = s.last_checkpoint()
        manifest = s.copy / f"{cid}.manifest"
        held.arm()
        # The command itself looks: the copy is there before anything of it runs.
        out = await s.call("bash", {"command": f"test -f {manifest} && echo there || echo missing"})
        assert "there" in out, out
        assert held.order[:2] == ["asked", "written"]  # it waited for the held write
        m = mf.decode(manifest.read_bytes())
        assert mf.blobs(m) <= {p.name for p in (s.copy / "blobs").iterdir()}


async def test_a_restore_and_a_read_of_the_copies_wait_for_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with held_copy(tmp_path, monkeypatch, "a.txt") as (s, held):
        await s.call("write", {"path": "a.txt", "content": "one\n"})
        cid = s.last_checkpoint()
        (Path(s.space.root) / "a.txt").write_text("changed behind its back\n")
        held.arm()
        await s.snaps.restore(s.space, cid, 1)  # with the copy's write still held
        assert held.order[:2] == ["asked", "written"]
        assert (Path(s.space.root) / "a.txt").read_text() == "one\n"
        assert (s.copy / f"{cid}.manifest").is_file()  # written before the restore ran
        for ext in ("tmp", "pending"):
            assert not list(s.copy.glob(f".{ext}-*"))


async def test_a_copy_write_that_fails_only_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with session(tmp_path, monkeypatch) as s:
        await s.call("write", {"path": "a.txt", "content": "one\n"})
        slow = copy_behind.CopyWrite.write

        def full(self: copy_behind.CopyWrite, *a: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")  # the copy's disk is full

        with caplog.at_level(logging.WARNING):
            monkeypatch.setattr(copy_behind.CopyWrite, "write", full)
            await s.call("write", {"path": "b.txt", "content": "two\n"})
            cid = s.last_checkpoint()
            await s.snaps.settle()
        assert "was not written: [Errno 28]" in caplog.text
        assert not (s.copy / f"{cid}.manifest").exists()
        assert s.snaps.store is not None and s.snaps.store.get(cid) is not None
        monkeypatch.setattr(copy_behind.CopyWrite, "write", slow)
        await s.call("write", {"path": "c.txt", "content": "three\n"})  # carries on
        await s.snaps.restore(s.space, cid, 1)  # from the store
        assert sorted(p.name for p in Path(s.space.root).iterdir()) == ["a.txt", "b.txt"]


async def test_the_copy_starts_once_the_result_is_committed_and_needs_no_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not beside the rest of the call (its CPU and the GIL: ``Behind.hold``), and not
    left for the next call to start either: the result's commit releases it."""
    started: list[float] = []
    real = copy_behind.CopyWrite.write

    def timed(self: copy_behind.CopyWrite, *a: Any) -> None:
        started.append(time.monotonic())
        real(self, *a)

    monkeypatch.setattr(copy_behind.CopyWrite, "write", timed)
    async with tool_session(tmp_path) as s:
        await s.call("write", {"path": "a.txt", "content": "one\n"})
        await s.snaps.settle()
        started.clear()
        committing = await _call_with_a_slow_result_commit(s)
        deadline = time.monotonic() + HANG_S  # no settle, no next call: only the release
        while not started and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert started, "the copy was never started after the result's commit"
        assert committing and started[0] > committing[0]
        cid = s.state().last_checkpoint
        await s.snaps.settle()
        assert (Path(s.space.root).parent / ".ds-checkpoints" / f"{cid}.manifest").is_file()


async def test_the_stores_files_are_made_ahead_again_only_after_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's batch used files made ahead (``inode_pool``); making them again ran
    beside the checkpoint's hand-back and the result's commit when its commit asked for
    it. It is asked for with the copy's write, after the result's commit; and still
    asked for, with no next call."""
    topped: list[tuple[str, float]] = []
    real = inode_pool.InodePool.top_up

    def timed(self: inode_pool.InodePool, directory: str, dev: int, used: int) -> None:
        topped.append((directory, time.monotonic()))
        real(self, directory, dev, used)

    monkeypatch.setattr(inode_pool.InodePool, "top_up", timed)
    async with tool_session(tmp_path) as s:
        await s.call("write", {"path": "a.txt", "content": "one\n"})
        await s.snaps.settle()
        assert s.snaps.store is not None
        store_dir = os.fspath(s.snaps.store.dir)
        topped.clear()
        committing = await _call_with_a_slow_result_commit(s)
        deadline = time.monotonic() + HANG_S  # no settle, no next call
        while not any(d == store_dir for d, _ in topped) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        at = [t for d, t in topped if d == store_dir]
        assert at, f"the store's pool was never topped up after the call: {topped}"
        assert committing and min(at) > committing[0], "topped up before the result's commit"


async def _call_with_a_slow_result_commit(s: ToolSession) -> list[float]:
    """A checkpoint-mode bash call whose result's commit takes 0.1 s (what runs beside
    it would be running by its end); returns when that commit ended."""
    t = s.registry.get("bash")
    assert t is not None
    ctx = ToolContext(
        harness=s.harness, conversation_id=s.conv, call_id="late", tool_name="bash",
        task_id="late", attempt=1, resumed=False, env=await s.harness.env(s.conv),
    )  # fmt: skip
    res = await t.execute({"command": "echo two > b.txt"}, ctx)
    committing: list[float] = []

    def slow_commit(tx: Any, entry_id: str) -> None:
        time.sleep(0.1)
        committing.append(time.monotonic())

    ctx.on_result(slow_commit)
    await record_result(s.harness, ctx, res)
    return committing
