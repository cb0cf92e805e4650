"""The ``local`` Space's fork server (``backends/local/forkserver.py``): what it changes
(each command's supervisor is one of its children, with the caller's env) and what it
must not (the ledger, ``lost``, fences, restart), in the worlds where it is killed
mid-request, leaves stale files behind, is raced, or is of another code version."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from durable_spaces.backends.local.backend import LocalBackend, LocalSpace
from durable_spaces.backends.local.forkserver import MARK, META, SOCK, request
from durable_spaces.backends.local.forkserver_client import version
from durable_spaces.errors import ConfigError, StaleEpochError
from durable_spaces.host.proc_start import started
from durable_spaces.settings import Settings
from durable_spaces.space import ExecState
from tests.backends import test_local

_DRIVER = r"""
import asyncio, sys
from durable_spaces.backends import open_backend

async def main(state_dir, name, key, script):
    space = await open_backend("local", state_dir).find(name)
    ex = await space.spawn(["sh", "-c", script], key=key, epoch=1)
    print("spawned", flush=True)
    r = await ex.wait()
    print(r.exit_code, r.output.decode().strip(), flush=True)

asyncio.run(main(*sys.argv[1:5]))
"""


backend, space = test_local.backend, test_local.space  # the same fixtures (Space "loc")


@pytest.fixture(autouse=True)
def _server_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DS_LOCAL_FORKSERVER", raising=False)


def _d(space: LocalSpace) -> Path:
    return Path(space.root).parent


def _server(space: LocalSpace) -> psutil.Process:
    meta = json.loads((_d(space) / META).read_text())
    p = psutil.Process(meta["pid"])
    assert started(p.pid) == pytest.approx(meta["ctime"], abs=0.01)
    return p


def _marked(space: LocalSpace) -> list[psutil.Process]:
    """Every live process carrying the Space's fork server mark."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == space.instance_id and p.status() != "zombie":
                out.append(p)
        except psutil.Error:
            pass
    return out


def _driver(state_dir: Path, key: str, script: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(state_dir), "loc", key, script],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
    )


async def _stopped(pid: int) -> None:
    for _ in range(600):
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{pid} never stopped")


async def test_supervisors_are_the_servers_children_with_the_callers_env(
    space: LocalSpace,
) -> None:
    ex = await space.spawn(["sleep", "30"], key="c:1:0@1", epoch=1)
    server = _server(space)
    assert psutil.Process(ex.pid).ppid() == server.pid  # forked, not a fresh interpreter
    assert server.environ()[MARK] == space.instance_id
    assert "DS_SPACE" not in server.environ() and "DS_EPOCH" not in server.environ()
    r = await space.exec(
        ["sh", "-c", 'echo "[$DS_LOCAL_SERVER] $DS_EPOCH $DS_SPACE"'], key=None, epoch=1
    )
    assert r.output == f"[] 1 {space.instance_id}\n".encode()
    assert _server(space).pid == server.pid  # one server for every spawn


async def test_server_killed_between_its_fork_and_the_answer(
    space: LocalSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer comes from the child: the server's death right after its fork costs that
    spawn nothing, and the next spawn starts a new server."""
    armed = Settings(local_forkserver_failpoints="space.local.server_forked:1")
    space = LocalSpace(space.name, _d(space), space.instance_id, settings=armed)
    r = await space.exec(["sh", "-c", "echo one"], key="c:1:0@1", epoch=1)
    assert (r.exit_code, r.output) == (0, b"one\n")
    first = json.loads((_d(space) / META).read_text())["pid"]
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie"
    r = await space.exec(["sh", "-c", "echo two"], key="c:2:0@1", epoch=1)
    assert (r.exit_code, r.output) == (0, b"two\n")
    assert _server(space).pid != first


async def test_server_killed_after_the_answer_before_the_spec(
    state_dir: Path, space: LocalSpace
) -> None:
    """The supervisor is the caller's from its answer on: killing the server while the
    caller is stopped there changes nothing for the command."""
    await space.exec(["true"], key=None, epoch=1)  # the server runs
    server = _server(space)
    drv = _driver(state_dir, "c:1:0@1", "echo ran", DS_FAILPOINTS="space.local.forked:1:stop")
    try:
        await _stopped(drv.pid)
        server.kill()
        server.wait(5)
        os.kill(drv.pid, signal.SIGCONT)
        out, _ = await asyncio.to_thread(drv.communicate, timeout=60)
    finally:
        drv.kill()
    assert out == b"spawned\n0 ran\n"
    rec = await space.exec_record("c:1:0@1")
    assert (rec.state, rec.exit_code) == (ExecState.EXITED, 0)


@pytest.mark.parametrize("failpoint", ["space.local.server_started", "space.local.forked"])
async def test_driver_killed_at_the_server_steps_never_runs_the_command(
    state_dir: Path, space: LocalSpace, failpoint: str
) -> None:
    """Killed after the server started or after the child answered, before the pid is
    recorded: the key reads ``lost`` and its command never runs, then or later."""
    drv = _driver(state_dir, "c:1:0@1", "echo run >> counter", DS_FAILPOINTS=f"{failpoint}:1")
    await asyncio.to_thread(drv.wait, 60)
    assert drv.returncode == -9
    # Killed before it recorded a supervisor's pid: lost at once (a child the server
    # forked reads EOF and runs nothing, whenever it gets there).
    assert (await space.exec_record("c:1:0@1")).state is ExecState.LOST
    again = await space.exec(["sh", "-c", "echo run >> counter"], key="c:1:0@1", epoch=1)
    assert again.replayed and again.exit_code is None
    assert await space.stat("counter") is None
    server = _server(space)  # the dead driver's server serves the next driver
    await space.exec(["true"], key=None, epoch=1)
    assert _server(space).pid == server.pid


async def test_stale_files_of_a_dead_server_whose_pid_was_reused(space: LocalSpace) -> None:
    """A recorded server that is gone, its pid now an innocent process's and its socket
    file left: the spawn starts a new server and never signals the innocent."""
    innocent = subprocess.Popen(["sleep", "60"])
    try:
        d = _d(space)
        ctime = started(innocent.pid)
        meta = {"pid": innocent.pid, "ctime": ctime, "instance": space.instance_id,
                "version": version()}  # fmt: skip
        (d / META).write_text(json.dumps(meta))
        stale = socket.socket(socket.AF_UNIX)
        dirfd = os.open(d, os.O_PATH)  # the state dir may be longer than a socket path
        try:
            stale.bind(f"/proc/self/fd/{dirfd}/{SOCK}")
        finally:
            os.close(dirfd)
        stale.close()  # the file stays, nobody listens
        r = await space.exec(["sh", "-c", "echo ok"], key=None, epoch=1)
        assert r.output == b"ok\n"
        assert innocent.poll() is None
        assert _server(space).pid != innocent.pid
    finally:
        innocent.kill()
        innocent.wait()


async def test_server_of_another_code_version_is_replaced_its_commands_kept(
    space: LocalSpace,
) -> None:
    ex = await space.spawn(["sh", "-c", "sleep 0.5; echo kept"], key="c:1:0@1", epoch=1)
    old = _server(space)
    meta = json.loads((_d(space) / META).read_text())
    (_d(space) / META).write_text(json.dumps({**meta, "version": "older"}))
    r = await space.exec(["sh", "-c", "echo new"], key=None, epoch=1)
    assert r.output == b"new\n"
    assert _server(space).pid != old.pid
    assert not old.is_running() or old.status() == "zombie"
    result = await ex.wait()  # a supervisor of the old server runs on
    assert (result.exit_code, result.output) == (0, b"kept\n")


async def test_two_drivers_racing_to_start_the_server_start_one(
    state_dir: Path, space: LocalSpace
) -> None:
    drivers = [_driver(state_dir, f"c:{i}:0@1", f"echo {i}") for i in range(4)]
    outs = [await asyncio.to_thread(d.communicate, timeout=60) for d in drivers]
    assert sorted(o for o, _ in outs) == [f"spawned\n0 {i}\n".encode() for i in range(4)]
    assert [p.pid for p in _marked(space)] == [_server(space).pid]


async def test_restart_delete_and_kill_daemon_kill_the_server(
    backend: LocalBackend, space: LocalSpace
) -> None:
    for fault in (backend.restart, backend.kill_daemon):
        await space.exec(["true"], key=None, epoch=1)
        server = _server(space)
        await fault("loc")
        assert _marked(space) == []
        assert not server.is_running() or server.status() == "zombie"
    await space.exec(["true"], key=None, epoch=1)
    await backend.delete("loc")
    assert _marked(space) == []


async def test_advance_epoch_spares_the_server_and_fences_its_commands(
    space: LocalSpace,
) -> None:
    ex = await space.spawn(["sleep", "30"], key="c:1:0@1", epoch=1)
    server = _server(space)
    waiter = asyncio.create_task(ex.wait())
    await space.advance_epoch(2)
    with pytest.raises(StaleEpochError):
        await asyncio.wait_for(waiter, 10)
    assert _server(space).pid == server.pid and server.is_running()
    cmds = set((_d(space) / "cmds").iterdir())
    with pytest.raises(StaleEpochError):
        await space.spawn(["sh", "-c", "echo stale >> f"], key=None, epoch=1)
    assert set((_d(space) / "cmds").iterdir()) == cmds  # nothing was asked of the server
    r = await space.exec(["sh", "-c", "echo $DS_EPOCH"], key=None, epoch=2)
    assert r.output == b"2\n" and _server(space).pid == server.pid


async def test_falls_back_to_a_direct_supervisor(
    space: LocalSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No server can start (its socket path is taken by a directory), or it is turned
    off: every spawn still runs, under a supervisor started directly."""
    (_d(space) / SOCK).mkdir()
    ex = await space.spawn(["sh", "-c", "echo direct"], key="c:1:0@1", epoch=1)
    assert psutil.Process(ex.pid).environ().get("DS_SPACE") == space.instance_id
    assert (await ex.wait()).output == b"direct\n"
    assert _marked(space) == []
    (_d(space) / SOCK).rmdir()
    off = Settings(local_forkserver=False)
    space2 = LocalSpace(space.name, _d(space), space.instance_id, settings=off)  # no retry delay
    assert (await space2.exec(["sh", "-c", "echo off"], key=None, epoch=1)).output == b"off\n"
    assert not (_d(space) / META).exists() and _marked(space) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
async def test_connections_from_another_uid_are_closed_unanswered(space: LocalSpace) -> None:
    await space.exec(["true"], key=None, epoch=1)
    before = {p.pid for p in _marked(space)}
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)
        link = os.path.join(tmp, "s")
        os.link(_d(space) / SOCK, link)  # a path another uid can reach
        os.chmod(link, 0o777)
        cmd = _d(space) / "cmds" / "x"
        cmd.mkdir()  # a real command directory: only the uid check stands in the way
        code = (
            "import os, socket, sys\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])\n"
            "try:\n    s.sendall(bytes.fromhex(sys.argv[2])); got = s.recv(64)\n"
            "except (BrokenPipeError, ConnectionResetError):\n    got = b''\n"
            "sys.stdout.write(repr(got))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, link, request(str(cmd)).hex()],
            capture_output=True, timeout=30, check=True,
        )  # fmt: skip
    assert out.stdout == b"b''"  # closed unread: no pid, no child
    assert not (cmd / "supervisor.log").exists()
    assert {p.pid for p in _marked(space)} == before
    assert (await space.exec(["sh", "-c", "echo mine"], key=None, epoch=1)).output == b"mine\n"


async def test_an_idle_server_retires_under_the_lock_and_comes_back(
    space: LocalSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    space = LocalSpace(
        space.name, _d(space), space.instance_id, settings=Settings(local_forkserver_idle=0.5)
    )
    await space.exec(["true"], key=None, epoch=1)
    server = _server(space)
    lock = os.open(_d(space) / "lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a caller between its look and its request
        await asyncio.sleep(2.5)
        assert server.is_running() and server.status() != "zombie"
    finally:
        os.close(lock)
    server.wait(10)  # it retires once the lock is free
    assert not (_d(space) / META).exists() and not (_d(space) / SOCK).exists()
    assert (await space.exec(["sh", "-c", "echo back"], key=None, epoch=1)).output == b"back\n"
    assert _server(space).pid != server.pid


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("DS_LOCAL_FORKSERVER", "yes"),
        ("DS_LOCAL_FORKSERVER", ""),
        ("DS_SPACE_JOURNAL", "off"),
        ("DS_LOCAL_FORKSERVER_IDLE", "soon"),
        ("DS_LOCAL_FORKSERVER_IDLE", "nan"),
        ("DS_LOCAL_FORKSERVER_IDLE", "-1"),
        ("DS_LOCAL_FORKSERVER_IDLE", "inf"),
    ],
)
async def test_a_malformed_knob_fails_the_open_naming_it(
    space: LocalSpace, monkeypatch: pytest.MonkeyPatch, knob: str, value: str
) -> None:
    """A malformed environment is an error that names the variable, raised when the
    backend reads its settings (before any Space is opened or any key written to its
    ledger), not a silent default."""
    with monkeypatch.context() as mp, pytest.raises(ConfigError, match=knob):
        mp.setenv(knob, value)
        LocalBackend(_d(space).parent)
    assert not (_d(space) / META).exists()
