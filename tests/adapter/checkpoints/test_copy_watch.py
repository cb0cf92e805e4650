"""The watch on the blobs of a Space's checkpoint copy (``adapter/checkpoints/copy_watch.py``): a
checkpoint on a host workspace lists the copy's blobs once per Space instance, and
whatever an agent does to them in between (a blob deleted, one renamed away, the
directory or the copy replaced) is still put back by the next checkpoint, as a listing would."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from durable_spaces.adapter.checkpoints import copy_watch
from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.snapshots import DirectoryCheckpointStore
from durable_spaces.backends import open_backend
from durable_spaces.space import Space
from tests.adapter.settled import SettledSnapshots

FILES = {f"d{i % 3}/f{i:02d}.txt": f"file {i}\n".encode() * (i + 1) for i in range(12)}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def agent(space: Space, script: str) -> None:
    res = await space.exec(["bash", "-c", script], key=None, epoch=1, cwd="/")
    assert res.exit_code == 0, res.output


async def test_blobs_an_agent_removes_from_the_copy_are_put_back_without_a_listing(
    tmp_path: Path,
) -> None:
    b = open_backend("local", tmp_path / "spaces")
    try:
        space = await b.create("watch")
        await space.advance_epoch(1)
        for path, data in FILES.items():
            await space.write_file(path, data, epoch=1)
        snaps = SettledSnapshots(b, store=DirectoryCheckpointStore(tmp_path / "store"))
        copy = Path(space.root).parent / ".ds-checkpoints"
        watch = snaps.taker._seen(space).copy_blobs

        async def checkpoint(call: str) -> set[str]:
            cid = await snaps.checkpoint(space, call, 1)
            m = mf.decode((copy / f"{cid}.manifest").read_bytes())
            for name in mf.blobs(m):  # every blob it needs, intact, in the copy
                assert sha((copy / "blobs" / name).read_bytes()) == name
            return mf.blobs(m)

        need = await checkpoint("call-1")
        assert watch.listed == 1
        await checkpoint("call-2")
        one, two = sorted(need)[:2]
        await agent(space, f"cd {copy}/blobs && rm {one} && mv {two} ../elsewhere")
        assert await checkpoint("call-3") == need
        assert watch.listed == 1  # the watch's events said which went
        await agent(space, f"cd {copy} && mv blobs blobs.old && mkdir blobs")
        assert await checkpoint("call-4") == need
        assert watch.listed == 2  # its watch ended: listed again
        await agent(space, f"mv {copy} {copy}.old && mkdir -p {copy}/blobs")
        assert await checkpoint("call-5") == need
        assert watch.listed == 3  # the watched directory is not the one opened now
    finally:
        for name in await b.names():
            await b.delete(name)
        await b.close()


def test_a_process_watches_few_copies_and_lists_the_others(tmp_path: Path) -> None:
    """Past ``MAX_WATCHED`` watched copies a copy is listed on every call (its names
    still right); one closed gives its instance to the next."""
    n = copy_watch.MAX_WATCHED + 1
    dirs = [tmp_path / f"c{i}" for i in range(n)]
    fds = []
    for d in dirs:
        d.mkdir()
        (d / ("a" * 64)).write_bytes(b"x")
        fds.append(os.open(d, os.O_RDONLY | os.O_DIRECTORY))
    watches = [copy_watch.BlobNames() for _ in dirs]
    try:
        for _ in range(3):
            for w, fd in zip(watches, fds, strict=True):
                assert w.names(fd) == {"a" * 64}
        assert [w.listed for w in watches] == [1] * (n - 1) + [3]
        (dirs[-1] / ("b" * 64)).write_bytes(b"y")
        assert watches[-1].names(fds[-1]) == {"a" * 64, "b" * 64}
        watches[0].close()
        watches[-1].names(fds[-1])  # watched now
        watches[-1].names(fds[-1])
        assert watches[-1].listed == 5
    finally:
        for w in watches:
            w.close()
        for fd in fds:
            os.close(fd)
