"""Checkpoints of a docker Space read on this host through the container's root
filesystem (``space.HostView``, ``incremental.Taker._by_view``): the walk, the journal
and the reads here, the Space's copy written here too, owned by the container's user
(who prunes it from inside); each checkpoint restores exactly, from the store or from
the Space's copy, and nothing the agent plants beside the workspace makes this host
write outside the container. Real Docker and the real image; skipped with the reason
when missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_spaces.adapter.checkpoints.incremental import copy_dir
from durable_spaces.adapter.checkpoints.store import DirectoryCheckpointStore
from durable_spaces.backends.docker.backend import DockerBackend
from durable_spaces.backends.docker.docker_space import DockerSpace
from tests.adapter.settled import SettledSnapshots

pytestmark = pytest.mark.docker


@pytest.fixture
def space(docker_space: DockerSpace) -> DockerSpace:
    if docker_space.host_view() is None:
        pytest.skip("the engine shows no container's files on this host (no MergedDir)")
    return docker_space


async def _sh(space: DockerSpace, script: str) -> str:
    r = await space.exec(["sh", "-c", script], key=None, epoch=1, cwd=space.root)
    assert r.exit_code == 0, r.output
    return r.output.decode()


async def _tree(space: DockerSpace) -> str:
    """The workspace as the container lists it: paths, modes, sizes, digests."""
    return await _sh(
        space,
        "find . -mindepth 1 \\( -type f -printf '%P %m %s ' -exec sha256sum {} \\; \\) "
        "-o \\( -type l -printf '%P -> %l\\n' \\) -o \\( -type d -printf '%P/\\n' \\) | sort",
    )


async def test_checkpoints_read_here_restore_exactly_from_store_and_copy(
    space: DockerSpace, tmp_path: Path
) -> None:
    store = DirectoryCheckpointStore(tmp_path / "store")
    snaps = SettledSnapshots(DockerBackend(tmp_path / "state"), store=store)
    await _sh(space, "mkdir -p a/b && echo one > a/b/f && echo two > t && ln -s t l")
    first = await snaps.checkpoint(space, "c1", 1)
    want = await _tree(space)
    await _sh(space, "echo more >> a/b/f && rm t && mkdir n && echo x > n/y && chmod 600 n/y")
    second = await snaps.checkpoint(space, "c2", 1)
    want2 = await _tree(space)
    assert snaps.taker.stats["full"] == 1 and snaps.taker.stats["journal"] == 1
    # What is made here beside the workspace belongs to the container's user.
    owners = await _sh(space, f"find {copy_dir(space)} -printf '%u\\n' | sort -u")
    assert owners.split() == ["cua"], owners
    await snaps.restore(space, first, 1)
    assert await _tree(space) == want
    (tmp_path / "store" / f"{second}.manifest").unlink()  # only the Space's copy has it
    await snaps.restore(space, second, 1)
    assert await _tree(space) == want2


async def test_the_containers_user_prunes_the_copy(space: DockerSpace, tmp_path: Path) -> None:
    snaps = SettledSnapshots(
        DockerBackend(tmp_path / "state"),
        store=DirectoryCheckpointStore(tmp_path / "store"),
        prune_every=1,
        backlog=0,
    )
    ids = []
    for n in range(3):
        await _sh(space, f"echo {n} > f{n}")
        ids.append(await snaps.checkpoint(space, f"c{n}", 1))
    await snaps.prune(space, lambda: {ids[-1]}, 1)
    left = await _sh(space, f"ls {copy_dir(space)}")
    assert f"{ids[-1]}.manifest" in left.split()
    assert not any(f"{i}.manifest" in left.split() for i in ids[:-1]), left


async def test_a_link_planted_at_the_copy_is_never_followed_here(
    space: DockerSpace, tmp_path: Path
) -> None:
    """The agent owns /home/cua: a link at the copy's name to /etc (this host's /etc
    here) is removed and the copy made in its place, in the container."""
    snaps = SettledSnapshots(
        DockerBackend(tmp_path / "state"), store=DirectoryCheckpointStore(tmp_path / "store")
    )
    await _sh(space, f"echo a > f && rm -rf {copy_dir(space)} && ln -s /etc {copy_dir(space)}")
    before = sorted(p.name for p in Path("/etc").iterdir())
    cid = await snaps.checkpoint(space, "c1", 1)
    assert sorted(p.name for p in Path("/etc").iterdir()) == before
    assert not Path("/etc/blobs").exists() and not Path(f"/etc/{cid}.manifest").exists()
    kind = await _sh(space, f"stat -c %F {copy_dir(space)}")
    assert kind.strip() == "directory", kind


async def test_a_workspace_swapped_between_checkpoints_is_the_one_checkpointed(
    space: DockerSpace, tmp_path: Path
) -> None:
    snaps = SettledSnapshots(
        DockerBackend(tmp_path / "state"), store=DirectoryCheckpointStore(tmp_path / "store")
    )
    await _sh(space, "echo old > f && mkdir d && echo deep > d/g")
    await snaps.checkpoint(space, "c1", 1)
    await _sh(space, "cd /home/cua && mv work away && mkdir work && echo new > work/n")
    want = await _tree(space)
    cid = await snaps.checkpoint(space, "c2", 1)
    await _sh(space, "rm -rf ./* && echo junk > j")
    await snaps.restore(space, cid, 1)
    assert await _tree(space) == want
