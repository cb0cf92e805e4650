"""Workspace checkpoints (manifests and blobs): the Space's copies are pruned by the log
when a store keeps every checkpoint; without a store they are the only copies and are all
kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from needs import need

from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints import space_copy
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.adapter.checkpoints.incremental import copy_dir
from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    WorkspaceSnapshots,
    host_blobs,
)
from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
from durable_spaces.adapter.review import workspace_at
from durable_spaces.adapter.space_state import DOC, SpaceState
from durable_spaces.backends import open_backend
from durable_spaces.harness.log import MemoryStorage
from durable_spaces.harness.models import ScriptedModel
from durable_spaces.harness.scheduler import AgentConfig, Conversation, Harness
from durable_spaces.harness.tools import CodingTools, Registry


@dataclass
class Run:
    harness: Harness
    durable: DurableSpaces
    root: Conversation
    checkpoints_dir: Path

    def recorded(self) -> set[str]:
        return SpaceState.from_json(self.root.document(DOC)).checkpoints()

    async def first_call_is_reviewable(self) -> bool:
        first = next(e for e in self.root.entries() if e.kind == "tool_result")
        ws = await workspace_at(self.harness, self.durable, self.root.id, first.id)
        return isinstance(ws, dict)


@asynccontextmanager
async def session(
    tmp: Path,
    store: bool,
    leftover: bool = False,
    backlog: tuple[int, int] = (1, 8 << 20),
    killed: bool = False,
) -> AsyncIterator[Run]:
    """Nine scripted steps in checkpoint mode on a local Space (``leftover``: a tar a
    killed driver left pending is there before the first call; ``killed``: a manifest a
    killed driver took and never recorded; ``backlog``: the snapshots' count and bytes)."""
    backend = open_backend("local", tmp / "spaces")
    snaps = WorkspaceSnapshots(
        backend,
        store=DirectoryCheckpointStore(tmp / "store") if store else None,
        prune_every=1,
        backlog=backlog[0],
        backlog_bytes=backlog[1],
    )
    durable = durable_spaces(backend, snapshots=snaps, mode="checkpoint", epoch=1)
    reg = Registry().install(CodingTools).install(durable.extension)
    h = await Harness.open(
        MemoryStorage(), models={"s": ScriptedModel(3, 9)}, registry=reg, env=durable.env
    )
    try:
        root = await h.root(AgentConfig(model="s"))
        space = await durable.space(root.id)
        ckpts = Path(space.root).parent / ".ds-checkpoints"
        if leftover:
            ckpts.mkdir(exist_ok=True)
            (ckpts / ".pending-call-killed.tar").write_bytes(b"left by a killed driver")
        if killed:
            ckpts.mkdir(exist_ok=True)
            (ckpts / f"{KILLED}.manifest").write_bytes(b"a killed driver's checkpoint")
        assert (await (await root.submit("go", request_id="r1")).wait()).status == "done"
        yield Run(h, durable, root, ckpts)
    finally:
        await h.close()
        for name in await backend.names():
            await backend.delete(name)
        await backend.close()


async def test_copies_in_the_space_are_pruned_when_a_store_keeps_them(tmp_path: Path) -> None:
    async with session(tmp_path, store=True, leftover=True) as run:
        names = {p.name for p in run.checkpoints_dir.iterdir()} - {"blobs"}
        in_space = {n.removesuffix(".manifest") for n in names}
        assert in_space == run.recorded()  # the pending leftover is gone too
        assert len(list((tmp_path / "store").glob("*.manifest"))) > len(in_space)
        needed = set()
        for cid in in_space:
            needed |= mf.blobs(mf.decode((run.checkpoints_dir / f"{cid}.manifest").read_bytes()))
        blobs = {p.name for p in (run.checkpoints_dir / "blobs").iterdir()}
        assert blobs == needed  # what no recorded manifest names is gone, nothing else
        assert await run.first_call_is_reviewable()  # read from the store


KILLED = CheckpointId.for_manifest("call-killed", b"a killed driver's checkpoint")


@pytest.mark.parametrize("backlog", [(3, 8 << 20), (100, 1), (100, 8 << 20)])
async def test_the_copy_is_pruned_once_its_backlog_is_reached(
    tmp_path: Path, backlog: tuple[int, int]
) -> None:
    """On a host workspace the prune's command runs only once the copy holds ``backlog``
    checkpoints the log does not record (or bytes of them): below that they stay
    (counted, not deleted); reaching it deletes them all, a killed driver's among them."""
    async with session(tmp_path, store=True, backlog=backlog, killed=True) as run:
        names = {p.name for p in run.checkpoints_dir.iterdir()} - {"blobs"}
        unrecorded = {n.removesuffix(".manifest") for n in names} - run.recorded()
        if backlog != (100, 8 << 20):
            assert len(unrecorded) < 3 and KILLED not in unrecorded
        else:  # nine steps never reach it: nothing was deleted
            assert KILLED in unrecorded and len(unrecorded) > 3


async def test_without_a_store_every_copy_in_the_space_is_kept(tmp_path: Path) -> None:
    async with session(tmp_path, store=False) as run:
        in_space = list(run.checkpoints_dir.iterdir())
        assert len(in_space) > len(run.recorded())  # the only copies: review reads them
        assert await run.first_call_is_reviewable()


@pytest.mark.parametrize("listed_here", [False, True])
async def test_a_prune_deletes_every_unneeded_blob_and_nothing_else(
    tmp_path: Path, listed_here: bool
) -> None:
    """The copy's blobs not needed go, whether the command lists them or this host did
    (``host_blobs``: only those to delete are sent); needed ones and other names stay, a
    listing that is wrong deletes nothing needed, and a planted symlink is not followed."""
    backend = open_backend("local", tmp_path / "spaces")
    try:
        space = await backend.create("prune")
        await space.advance_epoch(1)
        blobs = Path(copy_dir(space)) / "blobs"
        blobs.mkdir(parents=True)
        names = [c * 64 for c in "abcdef"]
        for n in [*names, "notes"]:
            (blobs / n).write_bytes(b"x")
        needed = {names[0], names[1]}
        present = host_blobs(copy_dir(space)) if listed_here else None
        if present is not None:
            present = [*present, names[1], "9" * 64]  # wrong: names one needed, one absent
        await space_copy.prune(space, copy_dir(space), [], needed, 1, present)
        assert {p.name for p in blobs.iterdir()} == {*needed, "notes"}
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / names[2]).write_bytes(b"keep")
        for p in blobs.iterdir():
            p.unlink()
        blobs.rmdir()
        blobs.symlink_to(outside)
        await space_copy.prune(space, copy_dir(space), [], needed, 1, [names[2]])
        assert (outside / names[2]).read_bytes() == b"keep" and not blobs.is_symlink()
    finally:
        for name in await backend.names():
            await backend.delete(name)
        await backend.close()


@pytest.mark.parametrize(
    "backend",
    [
        "local",
        pytest.param("spacesd", marks=pytest.mark.spacesd),
        pytest.param("docker", marks=pytest.mark.docker),
    ],
)
@pytest.mark.parametrize("blobs", [40, 1200])
async def test_the_prune_command_deletes_unneeded_blobs_on_every_backend(
    tmp_path: Path, backend: str, blobs: int
) -> None:
    """The command path (no listing from this host), as a Space's own user runs it: on
    docker that user could not open the daemon's stdin pipe again (``/dev/fd/3``), so
    no blob was ever pruned, and with 1200 blobs to keep (more than a pipe holds) the
    daemon's write of them failed. A copy that is not there takes the whole input too."""
    need(backend)
    b = open_backend(backend, tmp_path / "spaces")
    try:
        space = await b.create(f"pr-{blobs}")
        await space.advance_epoch(1)
        d = copy_dir(space)
        names = [f"{i:064x}" for i in range(blobs)]
        keep = names[5:]
        assert await space_copy.prune(space, d, [], keep, 1) == []  # no copy yet
        res = await space.exec(
            [
                "sh",
                "-c",
                f"mkdir -p {d}/blobs && cd {d}/blobs && xargs touch && ln -s /etc ../.tmp-keep",
            ],
            key=None,
            epoch=1,
            cwd=space.root,
            stdin="\n".join(names).encode(),
        )
        assert res.exit_code == 0, res.output
        await space_copy.prune(space, d, [], keep, 1)
        res = await space.exec(["sh", "-c", f"ls -A {d}/blobs"], key=None, epoch=1, cwd=space.root)
        assert sorted(res.output.decode().split()) == keep
    finally:
        for name in await b.names():
            await b.delete(name)
        await b.close()
