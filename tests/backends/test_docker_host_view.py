"""A docker Space scanned on this host through the container's root filesystem
(``docker.host_view``, ``spacesd.host_scan``): every table is the one the daemon's own
scan gives, the journal answers between full scans, and nothing the agent does to the
workspace's path (a link to this host's directories) makes the host read outside the
container. Real Docker and the real image; skipped with the reason when missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_spaces.backends.docker.backend import DockerBackend
from durable_spaces.backends.docker.docker_space import DockerSpace
from durable_spaces.backends.docker.host_view import WorkspaceView, merged_dir, open_beneath
from durable_spaces.backends.spacesd.spacesd_space import SpacesdSpace
from durable_spaces.space import PathTable

pytestmark = pytest.mark.docker


@pytest.fixture
def space(docker_space: DockerSpace) -> DockerSpace:
    return docker_space


def _need_host_view(space: DockerSpace) -> None:
    """Skip, saying why, where the engine shows no container's files here (another
    storage driver, a remote engine); where it does, the Space must scan through them."""
    c = space._backend.engine().containers.get(space.container_id)
    driver = (c.attrs.get("GraphDriver") or {}).get("Name")
    if merged_dir(c) is None:
        pytest.skip(f"the engine's storage driver {driver!r} shows no MergedDir on this host")
    assert space._host is not None, "MergedDir is here, yet the Space scans through the daemon"


async def _sh(space: DockerSpace, script: str) -> None:
    r = await space.exec(["sh", "-c", script], key=None, epoch=1, cwd=space.root)
    assert r.exit_code == 0, r.output


async def _both(space: DockerSpace) -> tuple[PathTable, PathTable]:
    """The Space's scan (here when it can) and the daemon's own of the same workspace
    (its ``find``: the journal in the Space off, which has tests of its own)."""
    space._guest.unavailable = "the daemon's own scan is find's here"
    return await space.scan("."), await SpacesdSpace.scan(space, ".")


async def test_the_host_scan_is_the_daemons_and_the_journal_answers(space: DockerSpace) -> None:
    _need_host_view(space)
    steps = [
        "mkdir -p a/b c && for i in 1 2 3; do echo $i > a/b/f$i; done && echo top > t",
        "echo more >> a/b/f1 && rm a/b/f2 && chmod 0700 a/b/f3 && ln -s ../t a/l",
        "mv a/b a/moved && mkdir -p a/b/new && echo n > a/b/new/x && ln a/moved/f1 hard",
        "rm -rf c a/moved && printf 'no newline' > 'sp ace' && touch -d 2001-01-01 t",
    ]
    for script in steps:
        await _sh(space, script)
        mine, daemons = await _both(space)
        assert mine == daemons, script
    stats = space._scans.stats
    assert stats["full"] == 1 and stats["journal"] >= len(steps) - 1, stats
    # What the last scan read is answered from here, by either form of its path.
    read = await space._host.read_files(["sp ace", "/home/cua/work/t", "a/b/new/x"])
    assert read == {"sp ace": b"no newline", "/home/cua/work/t": b"top\n"}


async def test_a_workspace_swapped_for_a_link_is_never_followed_here(
    space: DockerSpace,
) -> None:
    """The agent owns /home/cua: it moves the workspace away and links its path to
    /etc, which here would be this host's /etc. The next scan must not read it."""
    _need_host_view(space)
    await _sh(space, "echo kept > f")
    await space.scan(".")
    await _sh(space, "cd /home/cua && mv work away && ln -s /etc work")
    mine, daemons = await _both(space)
    assert mine == daemons
    assert not any(p in mine for p in ("hostname", "passwd", "os-release")), sorted(mine)[:20]


async def test_a_workspace_swapped_for_another_directory_is_the_one_scanned(
    space: DockerSpace,
) -> None:
    """The scans hold the workspace by a descriptor: when the agent moves it away and
    makes a new one at its path, the next scan is of the new one, as the daemon's is."""
    _need_host_view(space)
    await _sh(space, "echo old > f && mkdir d && echo deep > d/g")
    await space.scan(".")
    await _sh(space, "cd /home/cua && mv work away && mkdir work && echo new > work/n")
    mine, daemons = await _both(space)
    assert mine == daemons and set(mine) == {"n"}, sorted(mine)


async def test_a_restarted_container_is_scanned_in_full_again(
    space: DockerSpace, tmp_path: Path
) -> None:
    _need_host_view(space)
    await _sh(space, "echo one > f")
    await space.scan(".")
    b = DockerBackend(tmp_path / "state")
    try:
        await b.restart(space.name)
    finally:
        await b.close()
    await _sh(space, "echo two >> f && echo new > g")
    mine, daemons = await _both(space)
    assert mine == daemons and "g" in mine
    assert space._scans.stats["full"] == 2, space._scans.stats


def test_open_beneath_refuses_links_dots_and_other_filesystems(tmp_path: Path) -> None:
    (tmp_path / "root" / "home" / "w").mkdir(parents=True)
    (tmp_path / "root" / "link").symlink_to(tmp_path / "root" / "home")
    fd = open_beneath(str(tmp_path / "root"), "/home/w")
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "root" / "home" / "w"))
    finally:
        os.close(fd)
    for bad in ("/link/w", "/home/../home/w", "/home/./w"):
        with pytest.raises(OSError):
            open_beneath(str(tmp_path / "root"), bad)
    if os.stat("/").st_dev != os.stat("/proc").st_dev:
        with pytest.raises(OSError, match="another filesystem"):
            open_beneath("/", "/proc/self")
    view = WorkspaceView(str(tmp_path / "root"), "/home/w")
    first = view.resolve()
    assert os.path.samestat(os.stat(first), os.stat(tmp_path / "root" / "home" / "w"))
    view.close()


def test_no_merged_dir_means_no_host_view() -> None:
    class Fake:
        def __init__(self, attrs: object) -> None:
            self.attrs = attrs

    assert merged_dir(Fake({})) is None
    assert merged_dir(Fake({"GraphDriver": {"Name": "vfs", "Data": None}})) is None
    assert merged_dir(Fake({"GraphDriver": {"Data": {"MergedDir": "relative/x"}}})) is None
    assert merged_dir(Fake({"GraphDriver": {"Data": {"MergedDir": "/no/such/dir"}}})) is None
