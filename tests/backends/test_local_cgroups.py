"""A ``local`` Space's epochs in cgroups (``durable_spaces/backends/local/cgroups.py``):
nothing a command of an older epoch started outlives ``advance_epoch``, however it left
its process group, session or environment; the capability says when the host cannot."""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from durable_spaces.backends.local import cgroups as cgroups_module
from durable_spaces.backends.local.backend import LocalBackend, LocalSpace
from durable_spaces.errors import SpaceUnavailableError, StaleEpochError
from durable_spaces.host import cgroup as host_cgroup
from durable_spaces.space import CONTAINED_EPOCHS, EXEC_LEDGER, ExecState

needs_cgroup = pytest.mark.cgroup  # tests/needs.py: a skip outside CI, a failure on CI

#: Escapes from a command: each writes its pid to pid.txt, then waits for ``go`` and
#: writes late.txt. The plain one (no setsid), with setsid, and a double fork.
_LATE = "echo $$ > pid.txt; while [ ! -e go ]; do sleep 0.01; done; echo late > late.txt"
_INNER = _LATE.replace("$$", "\\$\\$")  # expanded by the innermost shell, not its parent
ESCAPES = {
    "env-i": f"env -i sh -c '{_LATE}' &",
    "setsid": f"setsid env -i sh -c '{_LATE}' &",
    "double-fork": f"(sh -c \"setsid env -i sh -c '{_INNER}' &\" &) ; exit 0",
}


@pytest.fixture(params=["forkserver", "direct"])
def supervisor(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a supervisor starts: forked by the Space's server, or a fresh one."""
    monkeypatch.setenv("DS_LOCAL_FORKSERVER", "1" if request.param == "forkserver" else "0")
    return str(request.param)


@pytest.fixture
async def backend(state_dir: Path) -> AsyncIterator[LocalBackend]:
    b = LocalBackend(state_dir)
    yield b
    for name in await b.names():
        await b.delete(name)


async def _escaped(space: LocalSpace, script: str, epoch: int) -> int:
    """Run ``script`` under ``epoch``; a pidfd of the process it left behind."""
    r = await space.exec(["sh", "-c", script], key=f"esc@{epoch}", epoch=epoch)
    assert r.exit_code == 0, r
    pid_file = Path(space.root) / "pid.txt"
    while not pid_file.exists() or not pid_file.read_text().strip():
        await asyncio.sleep(0.01)  # the escaped shell starts after its parent ended
    pid = int(pid_file.read_text())
    fd = os.pidfd_open(pid)
    env = psutil.Process(pid).environ()
    assert "DS_SPACE" not in env, "it cleared its environment: the mark cannot find it"
    return fd


def _exited(pidfd: int) -> bool:
    """A pidfd is readable once its process has exited."""
    return bool(select.select([pidfd], [], [], 0)[0])


@needs_cgroup
@pytest.mark.parametrize("escape", sorted(ESCAPES))
async def test_nothing_of_an_old_epoch_outlives_the_advance(
    backend: LocalBackend, supervisor: str, escape: str
) -> None:
    space = await backend.create("loc")
    await space.advance_epoch(1)
    pidfd = await _escaped(space, ESCAPES[escape], 1)
    try:
        assert not _exited(pidfd)
        await space.advance_epoch(2)
        # Dead when the advance returned: its late write can never land.
        assert _exited(pidfd)
        (Path(space.root) / "go").write_text("")
        assert not (Path(space.root) / "late.txt").exists()
        assert space.cgroups.dir is not None
        # Removed (a sweep of another test's backend may take the idle rest with it).
        assert not (space.cgroups.dir / "e1").exists()
    finally:
        os.close(pidfd)


@needs_cgroup
async def test_an_advance_kills_what_a_killed_driver_started(
    backend: LocalBackend, state_dir: Path
) -> None:
    """The driver that started the command is gone (SIGKILLed, as a crashed driver or a
    machine restart of the lab leaves it); the next driver's advance still finds it."""
    space = await backend.create("loc")
    await space.advance_epoch(1)
    child = (
        "import asyncio, sys\n"
        "from durable_spaces.backends.local.backend import LocalBackend\n"
        "async def main():\n"
        "    s = await LocalBackend(sys.argv[1]).find('loc')\n"
        "    r = await s.exec(['sh', '-c', sys.argv[2]], key='esc@1', epoch=1)\n"
        "    print(r.exit_code, flush=True)\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", child, str(state_dir), ESCAPES["setsid"]],
        check=True, capture_output=True,
    )  # fmt: skip
    assert out.stdout == b"0\n"
    pid_file = Path(space.root) / "pid.txt"
    while not pid_file.exists() or not pid_file.read_text().strip():
        await asyncio.sleep(0.01)
    pidfd = os.pidfd_open(int(pid_file.read_text()))
    try:
        again = await LocalBackend(state_dir).find("loc")  # a new handle, a new driver
        assert again is not None
        await again.advance_epoch(2)
        assert _exited(pidfd)
    finally:
        os.close(pidfd)


@needs_cgroup
async def test_the_fork_server_and_a_current_command_survive_the_advance(
    backend: LocalBackend,
) -> None:
    space = await backend.create("loc")
    await space.advance_epoch(1)
    old = await space.spawn(["sleep", "1000"], key="old@1", epoch=1)
    server = json.loads((Path(space.root).parent / "forkserver.json").read_text())
    await space.advance_epoch(2)
    new = await space.spawn(["sh", "-c", "echo $$; exec sleep 1000"], key="new@2", epoch=2)
    await space.advance_epoch(2)  # the same floor again: nothing is killed
    with pytest.raises(StaleEpochError):
        await old.wait()
    assert psutil.Process(server["pid"]).is_running()
    assert new.pid is not None and psutil.pid_exists(new.pid)
    assert space.cgroups.dir is not None and (space.cgroups.dir / "e2").exists()  # busy: kept
    await space.advance_epoch(3)
    with pytest.raises(StaleEpochError):
        await new.wait()
    assert psutil.Process(server["pid"]).is_running()


@needs_cgroup
async def test_delete_removes_the_spaces_cgroups(backend: LocalBackend) -> None:
    space = await backend.create("loc")
    ex = await space.spawn(["sleep", "1000"], key="k@1", epoch=1)
    assert space.cgroups.dir is not None and space.cgroups.dir.exists()
    assert space.cgroups.pids(), "the supervisor and its command are in the cgroup"
    await backend.delete("loc")
    assert not space.cgroups.dir.exists()
    assert ex.pid is not None and not psutil.pid_exists(ex.pid)


@needs_cgroup
async def test_a_backend_sweeps_the_cgroups_of_spaces_gone(state_dir: Path) -> None:
    """A Space whose directory went without its delete (a driver SIGKILLed inside it):
    the next backend of the state dir kills and removes its cgroups."""
    b = LocalBackend(state_dir)
    space = await b.create("loc")
    kept = await b.create("kept")
    await space.spawn(["sleep", "1000"], key="k@1", epoch=1)
    await kept.spawn(["sleep", "1000"], key="k@1", epoch=1)
    victims = [psutil.Process(p) for p in space.cgroups.pids()]
    shutil.rmtree(state_dir.resolve() / "loc")
    assert space.cgroups.dir is not None
    gone_state_dir = space.cgroups.dir.parent.parent / f"local-{os.getpid():016x}"
    (gone_state_dir / "a0" / "e1").mkdir(parents=True)  # a state dir removed, Spaces kept
    LocalBackend(state_dir)
    assert not gone_state_dir.exists()
    assert not space.cgroups.dir.exists()
    assert victims and not any(p.is_running() and p.status() != "zombie" for p in victims)
    assert kept.cgroups.pids(), "a Space that exists keeps its commands"
    await b.delete("kept")


async def test_without_cgroups_the_capability_says_why(tmp_path: Path) -> None:
    """A cgroup root that is a plain directory: no containment, said with the reason, and
    the Space still works as before (the fence is the group and the mark)."""
    plain = tmp_path / "not-cgroupfs"
    plain.mkdir()
    b = LocalBackend(tmp_path / "spaces", cgroup_root=plain)
    space = await b.create("loc")
    caps = await space.capabilities()
    assert CONTAINED_EPOCHS not in caps.features and EXEC_LEDGER in caps.features
    assert "not a cgroup v2 directory" in caps.missing[CONTAINED_EPOCHS]
    assert space.cgroups.dir is None
    ex = await space.spawn(["sleep", "1000"], key="k@1", epoch=1)
    await space.advance_epoch(2)
    with pytest.raises(StaleEpochError):
        await ex.wait()
    await b.delete("loc")


async def test_a_cgroup_root_that_cannot_be_made(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    b = LocalBackend(tmp_path / "spaces", cgroup_root=blocker / "below")
    space = await b.create("loc")
    why = (await space.capabilities()).missing[CONTAINED_EPOCHS]
    assert "cannot make a cgroup" in why
    await b.delete("loc")


_READ_BACK = (  # a Space's first use reads the record back (and writes its own)
    "import sys; from pathlib import Path\n"
    "from durable_spaces.backends.local.cgroups import parent_for\n"
    "parent_for(Path(sys.argv[1]).resolve())\n"
)


@needs_cgroup
@pytest.mark.parametrize(
    "bad",
    [
        "/tmp/{leaf}",  # outside the cgroup hierarchy
        "{mount}/../../tmp/{leaf}",  # out of it through '..'
        "{mount}/local-0000000000000000",  # another state dir's
        "{leaf}",  # not absolute
        "{mount}/a\nb/{leaf}",  # not a plain name
    ],
)
async def test_a_recorded_parent_that_is_not_ours_is_not_used(state_dir: Path, bad: str) -> None:
    """``.cgroup-parent`` is read back by every process: a path outside the cgroup
    hierarchy, through '..', or another state dir's is replaced by the process's own."""
    backend = LocalBackend(state_dir)
    await backend.create("recorded")  # a Space's first use records the parent
    record = state_dir.resolve() / ".cgroup-parent"
    good = record.read_text()
    leaf = Path(good.strip()).name
    mount = Path(good.strip()).parent.parent
    record.write_text(bad.format(leaf=leaf, mount=mount) + "\n")
    subprocess.run([sys.executable, "-c", _READ_BACK, str(state_dir)], check=True)
    assert record.read_text() == good


def _stopping(pid: int) -> bool:
    """Stopped, or a SIGSTOP sent and not yet taken (so no wait is needed to tell)."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
    return status["State"].strip().startswith("T") or bool(pending & (1 << (19 - 1)))


@needs_cgroup
async def test_pause_stops_what_left_the_group_and_the_mark(backend: LocalBackend) -> None:
    """The lab's pause freezes the whole machine: an escaped process too."""
    space = await backend.create("loc")
    await space.advance_epoch(1)
    pidfd = await _escaped(space, ESCAPES["setsid"], 1)
    pid = int((Path(space.root) / "pid.txt").read_text())
    try:
        assert not _stopping(pid)
        await backend.pause("loc")
        assert _stopping(pid)
        await backend.resume("loc")
        assert not _stopping(pid)
    finally:
        os.close(pidfd)


@needs_cgroup
async def test_a_cgroup_above_ours_that_went_is_not_made_again(tmp_path: Path) -> None:
    """The Spaces' cgroups under a lab run's cgroup that was removed meanwhile: a spawn
    fails with why (nothing recorded), and the run's cgroup is not made again."""
    outer = host_cgroup.Cgroup.create(f"test-{os.getpid()}-outer")
    b = LocalBackend(tmp_path / "spaces", cgroup_root=outer.path / "durable-spaces")
    space = await b.create("loc")
    assert (await space.exec(["true"], key="k@1", epoch=1)).exit_code == 0
    outer.remove()
    with pytest.raises(SpaceUnavailableError, match="a level above it is gone"):
        await space.exec(["true"], key="k2@1", epoch=1)
    assert not outer.path.exists()
    assert (await space.exec_record("k2@1")).state is ExecState.UNKNOWN  # nothing recorded
    await b.delete("loc")


@needs_cgroup
async def test_a_cgroup_removed_while_its_kill_waits_counts_as_empty(backend: LocalBackend) -> None:
    """Two advances kill the same epoch: the one that removes its cgroup first leaves
    the other holding ``cgroup.events`` of a cgroup that is gone (ENODEV on reading).
    A cgroup that could be removed was empty; the waiter says so instead of failing."""
    space = await backend.create("loc")
    assert space.cgroups.dir is not None
    gone = space.cgroups.dir / "e9"
    gone.mkdir(parents=True)
    fd = os.open(gone / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    try:
        gone.rmdir()
        assert cgroups_module._says_empty(fd)
    finally:
        os.close(fd)
