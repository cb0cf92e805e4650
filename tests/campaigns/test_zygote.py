"""The zygote (drive/warm_zygote.py, drive/zygote.py) over real processes: every
attempt, the first included, is a fork of it with the exit code it relays; a spare holds
nothing of the zygote's; a request it cannot take is refused and the spares are spawned
as before; a killed zygote costs the exit code of the driver it forked, never the
session; a caller that hangs up takes its spare with it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from toy_driver import launches

from durable_spaces.drive import zygote as zy
from durable_spaces.drive.coordinator import Coordinator, CoordinatorResult
from durable_spaces.drive.protocol import EXIT_PERMANENT
from durable_spaces.drive.supervisor import Attempt

HERE = Path(__file__).parent
TOY_M = [sys.executable, "-m", "toy_driver"]


@pytest.fixture
def toy_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The toy driver importable, in the environment the zygote and the coordinator
    share (as a runner's workers and its zygote do)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv(zy.SOCKET_ENV, raising=False)
    return os.environ  # type: ignore[return-value]


def plan(monkeypatch: pytest.MonkeyPatch, behaviours: dict[str, str]) -> None:
    """The toy's plan, set before the zygote starts: its imports see the environment."""
    monkeypatch.setenv("TOY_PLAN", json.dumps(behaviours))


def coord(tmp_path: Path, **kw: Any) -> Coordinator:
    opts: dict[str, Any] = dict(stall_secs=10, heartbeat_secs=0.1, backoff=(0.05, 0.5, 2))
    opts.update(max_attempts=6, timeout_secs=90, warm=True)
    return Coordinator(TOY_M, tmp_path, "toy", env=kw.pop("env", {}), **(opts | kw))


def zygote_pid() -> int:
    """The zygote serving this test: the one ``serving`` names in the environment (the
    test's other children may be zombies of earlier tests, with no command line)."""
    assert _serving, "no zygote is running"
    return _serving[-1].proc.pid


_serving: list[zy.CampaignZygote] = []


@contextlib.contextmanager
def serving(env: dict[str, str]) -> Iterator[zy.CampaignZygote]:
    with zy.serving(env, "toy_driver") as z:
        assert z is not None
        _serving.append(z)
        try:
            yield z
        finally:
            _serving.remove(z)


async def run_with_parents(c: Coordinator) -> tuple[CoordinatorResult, list[int]]:
    """The session, and the parent of each attempt's process: the zygote it said forked
    it, or this process for one spawned (a driver that ends at once is reaped by the
    time a look at /proc could tell)."""
    parents: list[int] = []

    async def watch() -> None:
        async for a in c.attempts():
            p = a.process
            parents.append(p.zygote if isinstance(p, zy.ForkedProcess) else os.getpid())

    task = asyncio.create_task(watch())
    r = await c.run()
    await task
    return r, parents


async def test_every_attempt_is_forked_with_its_exit_code(
    tmp_path: Path, toy_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan(monkeypatch, {"1": "crash", "2": "crash", "default": "done"})
    with serving(toy_env):
        zpid = zygote_pid()
        c = coord(tmp_path)
        r, parents = await run_with_parents(c)
    assert r.status == "done" and r.exit_codes == [1, 1, 0]
    assert [a.warm for a in c.history] == [True, True, True]  # the first one too
    assert parents == [zpid] * 3  # forked, not spawned
    assert launches(tmp_path) == [(a.epoch, a.pid) for a in c.history]
    assert not [e for e in r.events if e["event"] == "zygote_off"]


async def test_a_permanent_exit_is_relayed(
    tmp_path: Path, toy_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan(monkeypatch, {"default": "permanent"})
    with serving(toy_env):
        c = coord(tmp_path)
        r = await c.run()
    assert r.exit_codes == [EXIT_PERMANENT] and c.history[0].warm


async def first_attempt_hangs(
    tmp_path: Path,
    toy_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    act: Callable[[Coordinator, Attempt], Awaitable[None]],
) -> tuple[Coordinator, CoordinatorResult]:
    """A session whose first driver hangs until ``act`` (on the first attempt, half a
    second in) ends it; later ones are done."""
    plan(monkeypatch, {"1": "hang", "default": "done"})
    with serving(toy_env):
        c = coord(tmp_path)

        async def watch() -> None:
            async for a in c.attempts():
                if a.index == 0:
                    await asyncio.sleep(0.5)
                    await act(c, a)

        task = asyncio.create_task(watch())
        r = await asyncio.wait_for(c.run(), 60)
        await task
    return c, r


async def test_a_kill_is_relayed(
    tmp_path: Path, toy_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def kill(c: Coordinator, a: Attempt) -> None:
        c.kill_current("test")

    c, r = await first_attempt_hangs(tmp_path, toy_env, monkeypatch, kill)
    assert r.status == "done" and r.exit_codes == [-signal.SIGKILL, 0]
    assert all(a.warm for a in c.history)


async def test_a_spare_holds_only_its_stdin_stdout_and_stderr(
    tmp_path: Path, toy_env: dict[str, str]
) -> None:
    with serving(toy_env):
        env = {k: v for k, v in os.environ.items() if k not in {"DS_FAILPOINTS"}}
        env["PYTHONUNBUFFERED"] = "1"
        proc, launch = await zy.fork_spare(os.environ[zy.SOCKET_ENV], ["toy_driver"],
                                           tmp_path, None, env)  # fmt: skip
        try:
            fds = sorted(int(f) for f in os.listdir(f"/proc/{proc.pid}/fd"))
            assert fds == [0, 1, 2]
            assert os.getsid(proc.pid) == proc.pid  # a session of its own
            assert os.readlink(f"/proc/{proc.pid}/fd/2") == os.devnull
        finally:
            launch.close()
            os.kill(proc.pid, signal.SIGKILL)
            assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL


async def test_a_request_the_zygote_cannot_take_is_spawned_instead(
    tmp_path: Path, toy_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A variable read at import that the zygote's imports did not see: not forkable.
    plan(monkeypatch, {"1": "crash", "default": "done"})
    with serving(toy_env):
        c = coord(tmp_path, env={"DS_SOMETHING_AT_IMPORT": "1"})
        zpid = zygote_pid()
        r, parents = await run_with_parents(c)
    assert r.status == "done" and r.exit_codes == [1, 0]
    off = [e for e in r.events if e["event"] == "zygote_off"]
    assert off and "DS_SOMETHING_AT_IMPORT differs" in off[0]["reason"]
    assert zpid not in parents and len(parents) == 2  # spawned, as before the zygote


async def test_a_killed_zygote_costs_the_exit_code_not_the_session(
    tmp_path: Path, toy_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def kill_zygote_then_driver(c: Coordinator, a: Attempt) -> None:
        os.kill(zygote_pid(), signal.SIGKILL)
        await asyncio.sleep(0.3)
        assert psutil.pid_exists(a.pid)  # its driver runs on
        os.kill(a.pid, signal.SIGKILL)

    c, r = await first_attempt_hangs(tmp_path, toy_env, monkeypatch, kill_zygote_then_driver)
    # The spare forked before the zygote died is not used: the next driver is cold.
    assert r.status == "done" and r.exit_codes == [zy.UNKNOWN_EXIT, 0]
    assert [a.warm for a in c.history] == [True, False]
    assert [e for e in r.events if e["event"] == "zygote_off"]


CALLER = """
import asyncio, json, os, sys
from durable_spaces.drive import warm_launch as wl
from durable_spaces.drive import zygote as zy
from durable_spaces.drive.protocol import driver_environment

async def main():
    state, env = sys.argv[1], json.loads(sys.argv[2])  # the test's environment
    proc, launch = await zy.fork_spare(os.environ[zy.SOCKET_ENV], ["toy_driver"], state,
                                       None, env)
    env.update(driver_environment("toy", 1, state, 0.1))
    with open(os.path.join(state, "epoch-1.log"), "ab") as log:
        wl.send(launch, wl.encode(1, ["toy_driver"], env), log.fileno())
    launch.close()
    assert await proc.stdout.readline()  # launched: it heartbeats
    print(proc.pid, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def launched_by_a_caller(state: Path) -> tuple[subprocess.Popen[str], psutil.Process]:
    """Another process (``CALLER``) that forked a spare and launched it: it and the
    driver, running."""
    env = json.dumps({**os.environ, "PYTHONUNBUFFERED": "1"})
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, str(state), env],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert caller.stdout is not None
    line = caller.stdout.readline()
    assert line, caller.communicate()
    return caller, psutil.Process(int(line))


def test_a_caller_that_dies_takes_its_launched_spare_with_it(
    tmp_path: Path, toy_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A launched driver reads nothing more from its launch socket: only the zygote sees
    # that its caller (a coordinator, a worker the runner killed) is gone.
    plan(monkeypatch, {"default": "hang"})
    with serving(toy_env):
        caller, driver = launched_by_a_caller(tmp_path)
        assert driver.ppid() == zygote_pid() and launches(tmp_path) == [(1, driver.pid)]
        caller.kill()
        caller.wait()
        driver.wait(10)  # killed by the zygote (psutil.TimeoutExpired otherwise)


def test_a_bad_request_is_refused_in_one_line(tmp_path: Path, toy_env: dict[str, str]) -> None:
    with serving(toy_env):
        for data in (b"not json", json.dumps({"v": 1}).encode()):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.settimeout(10)
            s.connect(os.environ[zy.SOCKET_ENV])
            r, w = os.pipe()
            fd = w.to_bytes(4, sys.byteorder)
            s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd)])
            os.close(w)
            answer = json.loads(s.recv(65536))
            assert "refused" in answer and "pid" not in answer
            assert json.loads(s.recv(65536)) == {"exit": 0}  # the child that refused
            s.close()
            os.close(r)


async def test_a_stopped_zygote_does_not_leave_a_dead_driver_looking_alive(
    tmp_path: Path, toy_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped: list[int] = []

    async def stop_zygote_then_kill(c: Coordinator, a: Attempt) -> None:
        stopped.append(zygote_pid())
        os.kill(stopped[0], signal.SIGSTOP)  # it relays nothing while stopped
        c.kill_current("test")

    try:
        _, r = await first_attempt_hangs(tmp_path, toy_env, monkeypatch, stop_zygote_then_kill)
    finally:
        for pid in stopped:  # killed by now if its close found it stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    # The death was seen through the driver's pidfd, its code unknown; the next
    # spare (forked before the stop, still the zygote's) was taken and ran.
    assert r.status == "done" and r.exit_codes[0] == zy.UNKNOWN_EXIT
    assert r.exit_codes[-1] in (0, zy.UNKNOWN_EXIT)


def test_no_driver_outlives_its_campaigns_zygote(
    tmp_path: Path, toy_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller still holding its launched driver when the campaign ends (the runner
    # closes the zygote): the driver goes with the zygote, not on as an orphan.
    plan(monkeypatch, {"default": "hang"})
    with serving(toy_env):
        caller, driver = launched_by_a_caller(tmp_path)
    try:
        driver.wait(10)  # killed as the zygote ended (psutil.TimeoutExpired otherwise)
    finally:
        caller.kill()
        caller.wait()


ELSEWHERE = """
import asyncio, json, os, sys
from durable_spaces.drive import zygote as zy
async def main():
    env = json.loads(sys.argv[2])
    try:
        await zy.fork_spare(os.environ[zy.SOCKET_ENV], ["toy_driver"], sys.argv[1], None, env)
    except zy.ZygoteUnavailable as e:
        print("refused:", e)
    else:
        print("forked")

asyncio.run(main())
"""


@pytest.mark.netns
def test_a_caller_in_another_network_namespace_is_refused(
    tmp_path: Path, toy_env: dict[str, str]
) -> None:
    # A host of the redrive lab lives in a network namespace of its own: a driver forked
    # outside it would escape its partitions.
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.decode()[:200]}")
    with serving(toy_env):
        env = json.dumps({**os.environ, "PYTHONUNBUFFERED": "1"})
        here = subprocess.run([sys.executable, "-c", ELSEWHERE, str(tmp_path), env],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        there = subprocess.run(["unshare", "--net", sys.executable, "-c", ELSEWHERE,
                                str(tmp_path), env],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
    assert here.stdout.strip() == "forked", here.stderr
    assert "another net namespace" in there.stdout, (there.stdout, there.stderr)
