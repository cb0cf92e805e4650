"""Review: the workspace as of an entry, diffs between entries, the state before a
decision, forks at an entry, and the CLI's diff. Real harness, real local backend."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
from durable_spaces.adapter.image import ImageLimits
from durable_spaces.adapter.review import (
    SYMLINK,
    WorkspaceFiles,
    diff_entries,
    diff_workspaces,
    entry_before,
    fork_at,
    state_before,
    workspace_at,
    workspace_from_tar,
)
from durable_spaces.backends.local.backend import LocalBackend
from durable_spaces.cli.review_diff import review_diff_main
from durable_spaces.errors import PathEscapeError, ReviewError
from durable_spaces.harness.log import MemoryStorage, SqliteStorage, Storage
from durable_spaces.harness.models import ScriptedModel, implied_workspace
from durable_spaces.harness.scheduler import AgentConfig, Conversation, Entry, Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.space import Space

STEPS = 7


@dataclass
class Run:
    harness: Harness
    durable: DurableSpaces
    backend: LocalBackend
    root: Conversation

    async def close(self) -> None:
        await self.harness.close()
        await self.backend.close()


async def drive(
    tmp: Path,
    mode: str,
    *,
    store: bool = True,
    storage: Storage | None = None,
    limits: ImageLimits | None = None,
    steps: int = STEPS,
) -> Run:
    backend = LocalBackend(tmp / "spaces")
    snaps = WorkspaceSnapshots(
        backend, store=DirectoryCheckpointStore(tmp / "store") if store else None
    )
    durable = durable_spaces(
        backend,
        snapshots=snaps,
        mode=mode,  # type: ignore[arg-type]
        epoch=1,
        transactional=limits,
        namespace=f"review-{tmp.name}",
    )
    reg = Registry().install(CodingTools).install(durable.extension)
    models = {"scripted": ScriptedModel(11, steps), "fork": ScriptedModel(23, steps + 3)}
    h = await Harness.open(storage or MemoryStorage(), models=models, registry=reg, env=durable.env)
    root = await h.root(AgentConfig(model="scripted"))
    sub = await root.submit("go", request_id="r1")
    assert (await sub.wait()).status == "done"
    return Run(h, durable, backend, root)


def encoded(files: dict[str, str]) -> WorkspaceFiles:
    return {p: t.encode() for p, t in sorted(files.items())}


def upto(entries: list[Entry], entry_id: str) -> list[Entry]:
    ids = [e.id for e in entries]
    return entries[: ids.index(entry_id) + 1]


async def space_files(space: Space) -> WorkspaceFiles:
    table = await space.scan()
    return {p: await space.read_file(p) for p in sorted(table) if table[p].kind == "file"}


def results(conv: Conversation) -> list[Entry]:
    return [e for e in conv.entries() if e.kind == "tool_result"]


MODES = [
    pytest.param("transactional", True, id="transactional"),
    pytest.param("checkpoint", True, id="checkpoint-store"),
    pytest.param("checkpoint", False, id="checkpoint-in-space"),
]


@pytest.mark.parametrize(("mode", "store"), MODES)
async def test_workspace_at_every_entry_equals_the_transcript(
    tmp_path: Path, mode: str, store: bool
) -> None:
    run = await drive(tmp_path, mode, store=store)
    try:
        entries = run.root.entries()
        assert len(results(run.root)) == STEPS
        assert run.root.document("cua.space")["mode"] == mode
        for e in entries:
            got = await workspace_at(run.harness, run.durable, run.root.id, e.id)
            assert got == encoded(implied_workspace(upto(entries, e.id))), e.id
        space = await run.backend.find(run.durable.name_for(run.root.id))
        assert space is not None
        last = await workspace_at(run.harness, run.durable, run.root.id, entries[-1].id)
        assert last == await space_files(space)
        # A fork that has not run yet reads the same (its checkpoints live in the parent's
        # Space or the store, its blobs in the parent's documents).
        mid = results(run.root)[STEPS // 2].id
        fork = await run.root.fork(mid)
        assert await workspace_at(run.harness, run.durable, fork.id, mid) == encoded(
            implied_workspace(upto(entries, mid))
        )
    finally:
        await run.close()


async def test_auto_mode_switch_reads_image_then_checkpoints(tmp_path: Path) -> None:
    """Auto mode over a 2-file limit: early entries come from the image, later ones from
    checkpoints; each must still equal what the transcript implies."""
    run = await drive(tmp_path, "auto", limits=ImageLimits(max_files=2), steps=10)
    try:
        entries = run.root.entries()
        state = run.root.document("cua.space")
        assert state["mode"] == "checkpoint" and "max_files" in state["mode_reason"]
        modes = set()
        for e in entries:
            doc = run.root.document("cua.space", as_of=e.id)
            if doc:
                modes.add(doc["mode"])
            got = await workspace_at(run.harness, run.durable, run.root.id, e.id)
            assert got == encoded(implied_workspace(upto(entries, e.id))), e.id
        assert modes == {"transactional", "checkpoint"}
    finally:
        await run.close()


@pytest.mark.parametrize(("mode", "store"), MODES[:2])
async def test_diff_entries_and_state_before(tmp_path: Path, mode: str, store: bool) -> None:
    run = await drive(tmp_path, mode, store=store)
    try:
        entries = run.root.entries()
        res = results(run.root)
        a, b = res[1].id, res[-1].id
        diffs = await diff_entries(run.harness, run.durable, run.root.id, a, b)
        before = implied_workspace(upto(entries, a))
        after = implied_workspace(upto(entries, b))
        changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
        assert {d.path for d in diffs} == changed and changed
        for d in diffs:
            want = "added" if d.path not in before else "modified"
            assert d.status == want
            assert d.diff.startswith("---") and f"b/{d.path}" in d.diff
            new_lines = set(after[d.path].splitlines()) - set(before.get(d.path, "").splitlines())
            for line in new_lines:
                assert f"+{line}\n" in d.diff
        assert await diff_entries(run.harness, run.durable, run.root.id, b, b) == []

        for e in entries:
            if e.kind != "assistant" or not e.data["tool_calls"]:
                continue
            prev = entry_before(run.harness, run.root.id, e.id)
            assert prev is not None
            seen = await state_before(run.harness, run.durable, run.root.id, e.id)
            assert seen == encoded(implied_workspace(upto(entries, prev)))
        first = entries[0].id
        assert await state_before(run.harness, run.durable, run.root.id, first) == {}
    finally:
        await run.close()


FORK_MODES = [
    *MODES[:2],
    # Without a store the checkpoint lives in the parent's Space: the fork's first use
    # reads it from there and keeps a copy in its own Space.
    pytest.param("checkpoint", False, id="checkpoint-in-space"),
]


@pytest.mark.parametrize(("mode", "store"), FORK_MODES)
async def test_fork_at_an_entry_gets_the_workspace_at_it(
    tmp_path: Path, mode: str, store: bool
) -> None:
    run = await drive(tmp_path, mode, store=store)
    try:
        res = results(run.root)
        at = res[len(res) // 2].id
        expected = await workspace_at(run.harness, run.durable, run.root.id, at)
        assert expected == encoded(implied_workspace(upto(run.root.entries(), at)))
        fork = await fork_at(run.harness, run.durable, run.root.id, at, AgentConfig(model="fork"))
        assert await workspace_at(run.harness, run.durable, fork.id, at) == expected

        space = await run.backend.find(run.durable.name_for(fork.id))
        assert space is not None
        assert space.name != run.durable.name_for(run.root.id)
        assert await space_files(space) == expected

        sub = await fork.submit("continue", request_id="fork-1")
        assert (await sub.wait()).status == "done"
        assert len(results(fork)) > len(upto(results(run.root), at))
        last = fork.entries()[-1].id
        now = await space_files(space)
        assert now == encoded(implied_workspace(fork.entries()))
        assert await workspace_at(run.harness, run.durable, fork.id, last) == now
        # The parent's Space is untouched by the fork's calls.
        parent = await run.backend.find(run.durable.name_for(run.root.id))
        assert parent is not None
        assert await space_files(parent) == encoded(implied_workspace(run.root.entries()))
    finally:
        await run.close()


async def test_cli_diff_reads_a_sqlite_log(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    storage = SqliteStorage(state / "log.sqlite")
    run = await drive(tmp_path, "checkpoint", storage=storage)
    res = results(run.root)
    a, b = res[0].id, res[-1].id
    want = await diff_entries(run.harness, run.durable, run.root.id, a, b)
    await run.close()
    storage.close()

    text = await asyncio.to_thread(
        review_diff_main, state, "local", tmp_path / "spaces", a, b, store_dir=tmp_path / "store"
    )
    assert want
    for d in want:
        assert f"{d.status[0].upper()} {d.path}\n" in text
        assert d.diff in text
    # Without a store the tar is read from the Space that took it.
    text2 = await asyncio.to_thread(review_diff_main, state, "local", tmp_path / "spaces", a, b)
    assert text2 == text
    with pytest.raises(ReviewError):
        await asyncio.to_thread(review_diff_main, state, "local", tmp_path / "spaces", a, "e999")
    with pytest.raises(ReviewError, match="backend"):
        await asyncio.to_thread(review_diff_main, state, None, None, a, b)
    # What the campaign's agent.json records is enough.
    cfg = {"backend": "local", "backend_dir": str(tmp_path / "spaces"), "store_dir": None}
    (state / "agent.json").write_text(json.dumps(cfg))
    assert await asyncio.to_thread(review_diff_main, state, None, None, a, b) == text


async def test_stale_image_and_unknown_entries_are_refused(tmp_path: Path) -> None:
    """Explicit transactional mode over its limit marks the image stale: entries from
    there on cannot be reviewed (the log does not know the workspace), earlier ones can."""
    run = await drive(tmp_path, "transactional", limits=ImageLimits(max_files=2), steps=10)
    try:
        entries = run.root.entries()
        stale = [
            e
            for e in entries
            if (run.root.document("cua.space", as_of=e.id) or {}).get("image_stale")
        ]
        assert stale, "the scripted run never outgrew max_files=2"
        with pytest.raises(ReviewError, match="stale"):
            await workspace_at(run.harness, run.durable, run.root.id, stale[0].id)
        before = entries[entries.index(stale[0]) - 1]
        got = await workspace_at(run.harness, run.durable, run.root.id, before.id)
        assert got == encoded(implied_workspace(upto(entries, before.id)))
        with pytest.raises(ReviewError):
            await workspace_at(run.harness, run.durable, run.root.id, "e9999")
    finally:
        await run.close()


def test_tar_reading_refuses_escapes_and_keeps_symlinks() -> None:
    def tar(*members: tuple[str, bytes | None, str | None]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data, link in members:
                info = tarfile.TarInfo(name)
                if link is not None:
                    info.type, info.linkname = tarfile.SYMTYPE, link
                    t.addfile(info)
                else:
                    info.size = len(data or b"")
                    t.addfile(info, io.BytesIO(data or b""))
        return buf.getvalue()

    ws = workspace_from_tar(tar(("./a.txt", b"hi\n", None), ("./l", None, "a.txt")))
    assert ws == {"a.txt": b"hi\n", "l": SYMLINK + b"a.txt"}
    with pytest.raises(PathEscapeError):
        workspace_from_tar(tar(("../evil", b"x", None)))
    diffs = diff_workspaces(ws, {"a.txt": b"\x00\x01", "l": SYMLINK + b"b.txt", "n": b"new\n"})
    assert [(d.path, d.status) for d in diffs] == [
        ("a.txt", "modified"),
        ("l", "modified"),
        ("n", "added"),
    ]
    assert "Binary files" in diffs[0].diff
    assert "-symlink -> a.txt\n+symlink -> b.txt\n" in diffs[1].diff
    assert diffs[2].diff.startswith("--- /dev/null\n+++ b/n\n")
