"""What only the ``local`` backend promises: its layout, its crash windows (driven by real
SIGKILLs at failpoints), the pid-reuse guard, torn ledger lines and the environment mark."""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_spaces.backends import open_backend
from durable_spaces.backends.local.backend import LocalBackend, LocalSpace
from durable_spaces.errors import StaleEpochError
from durable_spaces.space import ExecState, Space, SpaceBackend

_CHILD = r"""
import asyncio, sys
from durable_spaces.backends import open_backend

async def main(state_dir, name, key, script):
    space = await open_backend("local", state_dir).find(name)
    ex = await space.spawn(["sh", "-c", script], key=key, epoch=1)
    print("spawned", flush=True)
    await asyncio.sleep(120)

asyncio.run(main(*sys.argv[1:5]))
"""


@pytest.fixture
async def backend(state_dir: Path) -> AsyncIterator[LocalBackend]:
    b = LocalBackend(state_dir)
    yield b
    for name in await b.names():
        await b.delete(name)


@pytest.fixture
async def space(backend: LocalBackend) -> LocalSpace:
    return await backend.create("loc")


async def _crash_child(state_dir: Path, key: str, script: str, failpoint: str) -> bytes:
    """Run a driver that spawns ``key`` and is SIGKILLed at ``failpoint``."""
    env = dict(os.environ, DS_FAILPOINTS=f"{failpoint}:1")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, str(state_dir), "loc", key, script,
        env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -9, (child.returncode, out)
    return out


def test_registry_builds_local(state_dir: Path) -> None:
    b = open_backend("local", state_dir)
    assert isinstance(b, LocalBackend) and isinstance(b, SpaceBackend)
    assert b.kind == "local"


async def test_layout(backend: LocalBackend, space: LocalSpace, state_dir: Path) -> None:
    assert isinstance(space, Space)
    d = state_dir.resolve() / "loc"
    assert space.root == str(d / "work")
    assert (d / "instance").read_text() == space.instance_id
    await space.exec(["true"], key="c:1:0@1", epoch=1)
    (line,) = (d / "ledger.jsonl").read_text().splitlines()
    assert json.loads(line)["key"] == "c:1:0@1" and json.loads(line)["argv"] == ["true"]
    assert await backend.names() == ["loc"]


@pytest.mark.parametrize("failpoint", ["space.local.ledger_written",
                                       "space.local.supervisor_recorded"])  # fmt: skip
async def test_driver_killed_before_the_command_started(
    state_dir: Path, space: LocalSpace, failpoint: str
) -> None:
    """The key is in the ledger but the command never started: ``lost``, never run later."""
    await _crash_child(state_dir, "c:1:0@1", "echo run >> counter", failpoint)
    for meta in Path(space.root).parent.glob("cmds/*/meta.json"):  # a supervisor it had
        await asyncio.to_thread(_wait_exit, json.loads(meta.read_text())["pid"])
    assert (await space.exec_record("c:1:0@1")).state is ExecState.LOST
    again = await space.exec(["sh", "-c", "echo run >> counter"], key="c:1:0@1", epoch=1)
    assert again.replayed and again.exit_code is None
    assert await space.stat("counter") is None


async def test_driver_killed_after_spawn(state_dir: Path, space: LocalSpace) -> None:
    """Killed right after the spawn: the command runs to its end without its driver."""
    await _crash_child(state_dir, "c:1:0@1", "sleep 0.3; echo done", "space.local.spawned")
    result = await (await space.spawn(["x"], key="c:1:0@1", epoch=1)).wait()
    assert (result.exit_code, result.output) == (0, b"done\n")


async def test_pid_reuse_is_not_mistaken_for_the_command(space: LocalSpace) -> None:
    ex = await space.spawn(["sleep", "30"], key="c:1:0@1", epoch=1)
    cmd_dir = Path(ex._dir)
    meta = json.loads((cmd_dir / "meta.json").read_text())
    # The supervisor dies; its pid now "belongs" to another process (ours, say).
    await LocalBackend(Path(space.root).parent.parent).restart("loc")
    meta["pid"] = os.getpid()
    (cmd_dir / "meta.json").write_text(json.dumps(meta))
    assert (await space.exec_record("c:1:0@1")).state is ExecState.LOST


async def test_torn_ledger_line_is_ignored(backend: LocalBackend, space: LocalSpace) -> None:
    ledger = Path(space.root).parent / "ledger.jsonl"
    with open(ledger, "ab") as f:
        f.write(b'{"key": "c:9:0@1", "ep')  # a writer died mid-line
    r = await space.exec(["sh", "-c", "echo hi"], key="c:1:0@1", epoch=1)
    assert r.output == b"hi\n"
    fresh = await backend.find("loc")
    assert fresh is not None
    assert (await fresh.exec_record("c:1:0@1")).state is ExecState.EXITED
    assert (await fresh.exec_record("c:9:0@1")).state is ExecState.UNKNOWN


def _wait_exit(pid: int) -> None:
    """Until the process ``pid`` has exited (its pidfd reads ready); at once if gone."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


async def _start_beater(space: LocalSpace) -> int:
    """A daemonized grandchild of epoch 1 (its own session, reparented away from the
    supervisor) that appends to ``beat`` until killed: a pidfd of it, once it runs."""
    beat = (
        "echo $$ > beater.tmp; mv beater.tmp beater; while :; do echo x >> beat; sleep 0.05; done"
    )
    script = f"(setsid sh -c '{beat}' &); sleep 30"
    await space.spawn(["sh", "-c", script], key="c:1:0@1", epoch=1)
    while await space.stat("beater") is None:
        await asyncio.sleep(0.01)  # the setsid shell starts after its parent's fork
    return os.pidfd_open(int(await space.read_file("beater")))


def _exited(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has exited, now (a pidfd reads ready then)."""
    try:
        return bool(select.select([pidfd], [], [], 0)[0])
    finally:
        os.close(pidfd)


async def test_restart_kills_processes_that_left_the_group(
    backend: LocalBackend, space: LocalSpace
) -> None:
    beater = await _start_beater(space)
    await backend.restart("loc")
    assert _exited(beater), "a process that left the group outlived the restart"


async def test_epoch_raise_kills_only_older_marked_processes(space: LocalSpace) -> None:
    """An older epoch's process that left the supervisor's group is found by its mark
    and killed; a newer epoch's, and one naming the instance in another variable, live."""
    beater = await _start_beater(space)
    base = {k: v for k, v in os.environ.items() if not k.startswith("DS_")}
    newer = subprocess.Popen(
        ["sleep", "30"], env={**base, "DS_SPACE": space.instance_id, "DS_EPOCH": "3"}
    )
    bystander = subprocess.Popen(["sleep", "30"], env={**base, "OTHER": space.instance_id})
    try:
        await space.advance_epoch(2)
        assert _exited(beater), "an older epoch's process outlived the advance"
        assert newer.poll() is None and bystander.poll() is None
    finally:
        for p in (newer, bystander):
            p.kill()
            p.wait()


async def test_invalid_names_refused(backend: LocalBackend) -> None:
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            await backend.create(bad)


async def test_fenced_driver_waiting_on_its_command_gets_stale_epoch(space: LocalSpace) -> None:
    """A command killed by advance_epoch ends its old driver's wait with StaleEpochError
    (the driver must stop), not with an exit status or a Space failure."""
    ex = await space.spawn(["sleep", "30"], key="c:1:0@1", epoch=1)
    waiter = asyncio.create_task(ex.wait())
    await asyncio.sleep(0.1)
    await space.advance_epoch(2)
    with pytest.raises(StaleEpochError):
        await asyncio.wait_for(waiter, 10)


async def test_commands_do_not_inherit_driver_secrets(
    space: LocalSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    r = await space.exec(["sh", "-c", 'echo "[$OPENAI_API_KEY] $DS_SPACE"'], key=None, epoch=1)
    assert r.output == f"[] {space.instance_id}\n".encode()


@pytest.mark.parametrize("fault", ["restart", "delete"])
async def test_the_machine_does_not_wait_for_a_client_paused_under_its_lock(
    state_dir: Path, backend: LocalBackend, space: LocalSpace, fault: str
) -> None:
    """A driver paused inside a spawn's critical section (``space.local.supervisor_
    recorded``: the Space lock held, the supervisor forked) would hold a restart or a
    removal for as long as it stays paused (a campaign's daemon kill at that point
    waited out the 60 s stall kill). The machine goes ahead after its patience; the
    paused spawn, continued, finds its command lost (restart) or the Space gone."""
    env = dict(os.environ, DS_FAILPOINTS="space.local.supervisor_recorded:1:pause")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SPAWN_AND_WAIT, str(state_dir), "loc", "c:1:0@1",
        "echo ran > out", env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        meta = Path(state_dir) / "loc" / "cmds"
        for _ in range(400):  # until the child stopped itself under the lock
            if any(meta.glob("*/meta.json")) and _stopped(child.pid):
                break
            await asyncio.sleep(0.025)
        assert _stopped(child.pid), "the child never paused at its failpoint"
        await asyncio.wait_for(getattr(backend, fault)("loc"), 30)
    finally:
        os.kill(child.pid, signal.SIGCONT)
    out, err = await asyncio.wait_for(child.communicate(), 60)
    if fault == "restart":
        assert out.split()[-1:] == [b"SpaceUnavailableError"], (out, err[-400:])
        assert await space.stat("out") is None  # its supervisor died before the spec
        assert (await space.exec_record("c:1:0@1")).state is ExecState.LOST
    else:
        assert out.split()[-1:] == [b"SpaceGoneError"], (out, err[-400:])
        assert await backend.find("loc") is None


_SPAWN_AND_WAIT = r"""
import asyncio, sys
from durable_spaces.backends import open_backend

async def main(state_dir, name, key, script):
    space = await open_backend("local", state_dir).find(name)
    try:
        r = await (await space.spawn(["sh", "-c", script], key=key, epoch=1)).wait()
        print("exited", r.exit_code)
    except Exception as e:
        print(type(e).__name__)

asyncio.run(main(*sys.argv[1:5]))
"""


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


async def test_a_workspace_on_another_filesystem_than_the_state_takes_writes(
    tmp_path: Path,
) -> None:
    """A Space's state on one filesystem and its workspace on another (the probe's power
    fault keeps a harness's state on a FUSE mount and its workspace on the disk): a write
    and a symlink are staged where a rename can reach (``fs._staging``); staged beside the
    state, every one failed with EXDEV."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's tmp dir")
    state = Path(tempfile.mkdtemp(dir=shm, prefix="ds-xdev-"))
    try:
        backend = LocalBackend(state)
        space = await backend.create("xdev")
        work = Path(space.root)
        work.rmdir()
        (tmp_path / "ws").mkdir()
        work.symlink_to(tmp_path / "ws", target_is_directory=True)
        await space.advance_epoch(1)
        await space.write_file("notes.txt", b"hello\n", epoch=1)
        await space.symlink("link", "notes.txt", epoch=1)
        assert (tmp_path / "ws" / "notes.txt").read_bytes() == b"hello\n"
        assert os.readlink(tmp_path / "ws" / "link") == "notes.txt"
        assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["link", "notes.txt"]
        await backend.close()
    finally:
        shutil.rmtree(state, ignore_errors=True)


_MARK_CHILD = r"""
import asyncio, sys
from durable_spaces.backends import open_backend

async def main(state_dir, name, key):
    space = await open_backend("local", state_dir).find(name)
    await space.ledger_mark(key, epoch=1)
    print("marked", flush=True)

asyncio.run(main(*sys.argv[1:4]))
"""


async def test_a_mark_is_durable_before_its_caller_goes_on(
    state_dir: Path, space: LocalSpace
) -> None:
    """A driver killed right after its mark's line (``space.local.ledger_written``, where
    a spawn's driver dies before its supervisor): the key reads exited, as the ``true``
    it stands for, and a later spawn under it replays, never runs."""
    env = dict(os.environ, DS_FAILPOINTS="space.local.ledger_written:1")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _MARK_CHILD, str(state_dir), "loc", "pos#1",
        env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -9 and out == b"", (child.returncode, out)
    rec = await space.exec_record("pos#1")
    assert (rec.state, rec.exit_code, rec.epoch) == (ExecState.EXITED, 0, 1)
    again = await space.exec(["sh", "-c", "echo run >> counter"], key="pos#1", epoch=1)
    assert again.replayed and await space.stat("counter") is None


async def test_a_commands_supervisor_waits_outside_the_workspace(space: LocalSpace) -> None:
    """The supervisor writes the exit status the adapter reads, then exits: while it waits
    it must not sit in the workspace, or a look for processes the command left there
    (``adapter/leftovers.py``) right after the status finds it (auto mode then left
    transactional mode for a command that left nothing)."""
    script = 'readlink "/proc/$PPID/cwd"; readlink -f .'
    r = await space.exec(["sh", "-c", script], key=None, epoch=1)
    parent, workspace = r.output.decode().splitlines()
    assert workspace == os.path.realpath(space.root)
    assert parent != workspace and not parent.startswith(workspace + "/")
