"""Warm drivers (drive/spares.py, drive/warm_driver.py, drive/warm_launch.py) over real
processes: a spare takes an attempt with the same pid, group, exit codes and failpoints
as a cold driver; a spare that dies while waiting is replaced; none outlives its
coordinator; a launch message it cannot trust ends it with exit 78 before the driver's
module runs; a warm driver killed mid-call recovers exactly as a cold one does."""

from __future__ import annotations

import array
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from toy_driver import launches

from durable_spaces.drive.coordinator import Coordinator, Launch
from durable_spaces.drive.protocol import driver_environment
from durable_spaces.drive.spares import Spares
from durable_spaces.drive.warm_launch import WARM_MODULE, encode

HERE = Path(__file__).parent
TOY_M = [sys.executable, "-m", "toy_driver"]
#: The toy driver (tests/campaigns/toy_driver.py) importable by ``-m``.
PATH_ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


def coord(tmp_path: Path, plan: dict[str, Any], **kw: Any) -> Coordinator:
    """A coordinator of the toy driver run by ``-m`` (so it can be warm), warm by default."""
    env = {"TOY_PLAN": json.dumps(plan), **PATH_ENV, **kw.pop("env", {})}
    opts: dict[str, Any] = dict(stall_secs=10, heartbeat_secs=0.1, backoff=(0.05, 0.5, 2))
    opts.update(max_attempts=6, timeout_secs=90, warm=True)
    return Coordinator(TOY_M, tmp_path, "toy", env=env, **(opts | kw))


def spares(c: Coordinator) -> Spares:
    s = c._drivers.spares
    assert s is not None
    return s


async def wait_spare(c: Coordinator, other_than: int | None = None, timeout: float = 60) -> int:
    """The pid of the coordinator's spare once it exists (and is not ``other_than``)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        spare = spares(c)._spare
        if spare is not None and spare.process.pid != other_than:
            return spare.process.pid
        await asyncio.sleep(0.01)
    raise AssertionError("no spare driver was started")


async def test_warm_attempts_are_the_spares_own_processes(tmp_path: Path) -> None:
    c = coord(tmp_path, {"1": "crash", "2": "crash", "default": "done"})
    spare_pids: list[int] = []

    async def watch() -> None:
        async for a in c.attempts():
            if a.index < 2:
                spare_pids.append(await wait_spare(c, other_than=a.pid))

    task = asyncio.create_task(watch())
    r = await c.run()
    await task
    assert r.status == "done" and r.epochs == [1, 2, 3] and r.exit_codes == [1, 1, 0]
    assert [a.warm for a in c.history] == [False, True, True]
    # Each warm attempt is the spare that waited, and it ran as the driver of its epoch.
    assert [a.pid for a in c.history[1:]] == spare_pids
    assert launches(tmp_path) == [(a.epoch, a.pid) for a in c.history]
    assert [e["warm"] for e in r.events if e["event"] == "launch"] == [False, True, True]
    assert len(r.resumes) == 2


async def test_a_killed_warm_driver_dies_like_a_cold_one(tmp_path: Path) -> None:
    c = coord(tmp_path, {"1": "hang", "2": "hang", "default": "done"})
    seen: list[tuple[int, int, int]] = []

    async def killer() -> None:
        async for a in c.attempts():
            if a.index < 2:
                if a.index == 0:
                    await wait_spare(c)
                while a.alive and a.first_step_ms is None:
                    await asyncio.sleep(0.01)
                p = psutil.Process(a.pid)
                seen.append((a.pid, os.getpgid(a.pid), os.getsid(a.pid)))
                assert p.cmdline()[:3] == [sys.executable, "-m", WARM_MODULE] or a.index == 0
                assert c.kill_current() == a.pid

    task = asyncio.create_task(killer())
    r = await c.run()
    await task
    assert r.status == "done" and r.kills == 2
    assert r.exit_codes == [-signal.SIGKILL, -signal.SIGKILL, 0]
    assert [a.warm for a in c.history] == [False, True, True]
    # Leader of its own group and session, as a cold driver (start_new_session) is.
    assert all(pid == pgid == sid for pid, pgid, sid in seen)
    assert [x.cause for x in r.resumes] == ["nemesis", "nemesis"]


async def test_failpoints_of_the_launch_arm_a_warm_driver(tmp_path: Path) -> None:
    def arm(launch: Launch) -> None:
        launch.env["DS_FAILPOINTS"] = "toy.step:2" if launch.index == 1 else ""

    c = coord(tmp_path, {"1": "crash", "default": "steps:3"}, before_launch=[arm])
    r = await c.run()
    assert r.status == "done"
    assert r.exit_codes == [1, -signal.SIGKILL, 0]
    assert [a.warm for a in c.history] == [False, True, True]
    steps = [
        (e["epoch"], e["data"]["n"])
        for e in r.events
        if e["event"] == "driver_event" and e["data"]["event"] == "step"
    ]
    assert steps == [(2, 1), (3, 1), (3, 2), (3, 3)]  # epoch 2 died at its second hit


async def test_a_spare_killed_before_launch_is_replaced(tmp_path: Path) -> None:
    c = coord(tmp_path, {"1": "hang", "default": "done"})
    pids: list[int] = []

    async def killer() -> None:
        async for a in c.attempts():
            if a.index == 0:
                first = await wait_spare(c)
                os.kill(first, signal.SIGKILL)
                pids.extend([first, await wait_spare(c, other_than=first)])
                c.kill_current()

    task = asyncio.create_task(killer())
    r = await c.run()
    await task
    assert r.status == "done" and r.exit_codes == [-signal.SIGKILL, 0]
    lost = [e for e in r.events if e["event"] == "warm_lost"]
    assert [e["pid"] for e in lost] == [pids[0]] and lost[0]["code"] == -signal.SIGKILL
    assert c.history[1].warm and c.history[1].pid == pids[1]
    assert not psutil.pid_exists(pids[0])  # reaped, not left a zombie


async def test_no_spare_outlives_its_coordinator(tmp_path: Path) -> None:
    start = tmp_path / "start"  # the driver steps on once the test has seen the spare
    c = coord(tmp_path, {"default": "done"}, env={"TOY_START_UNTIL": str(start)})

    async def note() -> list[int]:
        try:
            async for _ in c.attempts():
                return [await wait_spare(c)]
            return []
        finally:
            start.touch()

    task = asyncio.create_task(note())
    r = await c.run()
    (spare,) = await task
    assert r.status == "done" and r.epochs == [1]
    assert not psutil.pid_exists(spare)


async def test_the_next_spare_starts_once_the_driver_speaks(tmp_path: Path) -> None:
    # Not at its launch: the spare's start would take the CPU from the driver starting.
    # The first driver is silent until the test opens "quiet", and steps on (to its
    # crash) once it opens "start".
    quiet, start = tmp_path / "quiet", tmp_path / "start"
    env = {"TOY_QUIET_UNTIL": str(quiet), "TOY_START_UNTIL": str(start)}
    c = coord(tmp_path, {"1": "crash", "default": "done"}, env=env)
    seen: list[tuple[bool, int, bool]] = []

    async def watch() -> None:
        async for a in c.attempts():
            if a.index == 0:
                try:
                    while a.alive and not (tmp_path / "launches.log").exists():
                        await asyncio.sleep(0.01)  # until the driver runs (silent)
                    s = spares(c)
                    seen.append(
                        (s._spare is not None or s._starting is not None, a.heartbeats, a.alive)
                    )
                    quiet.touch()
                    await wait_spare(c)
                    seen.append((True, a.heartbeats, a.alive))
                finally:
                    quiet.touch()
                    start.touch()

    task = asyncio.create_task(watch())
    r = await c.run()
    await task
    assert r.status == "done" and r.exit_codes == [1, 0]
    assert seen[0] == (False, 0, True)  # no spare while the first driver starts
    assert seen[1][1] >= 1 and seen[1][2]  # the spare came once it spoke, as it ran
    assert [a.warm for a in c.history] == [False, True]


async def test_an_attempt_dying_before_it_speaks_leaves_a_spare(tmp_path: Path) -> None:
    c = coord(tmp_path, {"1": "stall", "default": "done"}, stall_secs=1.0)
    r = await c.run()
    assert r.status == "done" and r.exit_codes == [-signal.SIGKILL, 0] and r.stalls == 1
    assert [a.warm for a in c.history] == [False, True]


async def test_an_import_time_variable_that_differs_launches_cold(tmp_path: Path) -> None:
    def vary(launch: Launch) -> None:
        if launch.index == 1:
            launch.env["TOY_SOMETHING"] = "read at import, perhaps"

    c = coord(tmp_path, {"1": "crash", "2": "crash", "default": "done"}, before_launch=[vary])
    r = await c.run()
    assert r.status == "done"
    assert [a.warm for a in c.history] == [False, False, True]  # the spare was kept


async def test_warm_drivers_can_be_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DS_WARM_DRIVERS", "0")
    c = coord(tmp_path, {"1": "crash", "default": "done"}, warm=None)
    r = await c.run()
    assert r.status == "done" and [a.warm for a in c.history] == [False, False]
    assert c._drivers.spares is None


# --- the launch message, read strictly by a real spare -----------------------------------


class Spare:
    """A real spare of the toy driver, on a socket pair, outside any coordinator."""

    def __init__(self, tmp: Path, module: str = "toy_driver", *args: str) -> None:
        self.tmp = tmp
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        path = os.pathsep.join([str(tmp), PATH_ENV["PYTHONPATH"]])
        self.env = {**os.environ, "PYTHONPATH": path, "TOY_PLAN": json.dumps({"default": "done"})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", WARM_MODULE, str(tmp), module, *args],
            stdin=theirs,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
        )
        theirs.close()
        self.log = tmp / "epoch.log"

    def env_of(self, epoch: int) -> dict[str, str]:
        return {**self.env, **driver_environment("toy", epoch, self.tmp, 0.1)}

    def send(self, data: bytes, fds: list[int]) -> None:
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        self.sock.sendmsg([data], anc)
        self.sock.close()

    def finish(self) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=60)
        log = self.log.read_text() if self.log.exists() else ""
        return self.proc.returncode, out.decode(), err.decode() + log


def _message(sp: Spare, **change: Any) -> bytes:
    msg: dict[str, Any] = {"v": 1, "epoch": 3, "argv": ["toy_driver"], "env": sp.env_of(3)}
    msg.update(change)
    return json.dumps(msg).encode()


def _bad_cases(sp: Spare) -> dict[str, tuple[bytes, str]]:
    env3 = sp.env_of(3)
    return {
        "not json": (b"{nope", "not JSON"),
        "an array": (b"[]", "JSON object"),
        "an extra key": (_message(sp, extra=1), "exactly the keys"),
        "a version 2": (_message(sp, v=2), "version"),
        "another module": (_message(sp, argv=["durable_spaces.cli"]), "argv"),
        "an epoch not the env's": (_message(sp, epoch=4), "is not CUA_SESSION_EPOCH"),
        "a string epoch": (_message(sp, epoch="3"), "integer"),
        "a NUL in a value": (_message(sp, env={**env3, "X": "a\x00b"}), "NUL"),
        "a name with =": (_message(sp, env={**env3, "A=B": "1"}), "variable name"),
        "an import-time variable not the spare's": (
            _message(sp, env={**env3, "DS_MUTANTS": "rerun_exited"}),
            "cannot be taken warm: DS_MUTANTS",
        ),
        "a zero epoch": (
            _message(sp, epoch=0, env={**env3, "CUA_SESSION_EPOCH": "0"}),
            ">= 1",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "not json",
        "an array",
        "an extra key",
        "a version 2",
        "another module",
        "an epoch not the env's",
        "a string epoch",
        "a NUL in a value",
        "a name with =",
        "an import-time variable not the spare's",
        "a zero epoch",
    ],
)
def test_a_bad_launch_message_exits_78_before_the_driver_runs(tmp_path: Path, case: str) -> None:
    sp = Spare(tmp_path)
    data, says = _bad_cases(sp)[case]
    with open(sp.log, "ab") as log:
        sp.send(data, [log.fileno()])
    code, out, err = sp.finish()
    assert code == 78, err
    assert "bad launch" in err and says in err and "Traceback" not in err
    assert out == "" and launches(tmp_path) == []  # the toy driver never ran


@pytest.mark.parametrize("fds", ["none", "two", "a pipe", "read-only"])
def test_a_launch_without_one_writable_stderr_exits_78(tmp_path: Path, fds: str) -> None:
    sp = Spare(tmp_path)
    sp.log.write_bytes(b"")
    r, w = os.pipe()
    ro = os.open(sp.log, os.O_RDONLY)
    wr = os.open(sp.log, os.O_WRONLY | os.O_APPEND)
    given = {"none": [], "two": [wr, wr], "a pipe": [w], "read-only": [ro]}[fds]
    try:
        sp.send(_message(sp), given)
    finally:
        for fd in (r, w, ro, wr):
            os.close(fd)
    code, out, err = sp.finish()
    assert code == 78 and "Traceback" not in err
    assert out == "" and launches(tmp_path) == []


def test_a_good_launch_runs_the_driver_as_that_epoch(tmp_path: Path) -> None:
    sp = Spare(tmp_path)
    with open(sp.log, "ab") as log:
        sp.send(encode(3, ["toy_driver"], sp.env_of(3)), [log.fileno()])
    code, out, err = sp.finish()
    assert code == 0, err
    assert launches(tmp_path) == [(3, sp.proc.pid)]
    assert '"first_step"' in out and "CUA-HEARTBEAT 3 " in out


def test_what_the_spares_imports_wrote_into_its_environment_stays(tmp_path: Path) -> None:
    # As in a cold driver, whose imports run after its environment is set (the spacesd
    # backend's setdefault of DO_NOT_TRACK, say).
    # (In a module the driver imports: the driver's own module runs again at launch.)
    (tmp_path / "envtoy_dep.py").write_text(
        "import os\nos.environ.setdefault('ENVTOY', 'set by an import')\n"
    )
    (tmp_path / "envtoy.py").write_text(
        "import os, sys\n"
        "import envtoy_dep\n"
        "if __name__ == '__main__':\n"
        "    print(os.environ.get('ENVTOY'), os.environ['CUA_SESSION_EPOCH'], sys.argv[1:])\n"
    )
    sp = Spare(tmp_path, "envtoy", "--flag")
    with open(sp.log, "ab") as log:
        sp.send(encode(5, ["envtoy", "--flag"], sp.env_of(5)), [log.fileno()])
    code, out, err = sp.finish()
    assert code == 0, err
    assert out.strip() == "set by an import 5 ['--flag']"


def test_end_of_file_before_a_launch_exits_0_having_done_nothing(tmp_path: Path) -> None:
    sp = Spare(tmp_path)
    sp.sock.close()
    code, out, err = sp.finish()
    assert code == 0 and out == "" and err == ""
    assert launches(tmp_path) == []


def test_a_bad_command_line_exits_78(tmp_path: Path) -> None:
    sp = Spare(tmp_path, module="not a module")
    sp.sock.close()
    code, _, err = sp.finish()
    assert code == 78 and "not a module name" in err and "Traceback" not in err


# --- the real driver: a warm one killed mid-call recovers as a cold one ------------------

AGENT = [sys.executable, "-m", "durable_spaces.campaigns.agent"]
#: Attempt 0 (cold: no spare yet) dies as its second call begins; attempt 1 (warm when
#: on) dies with the resumed call in flight (its start committed, its outcome not).
KILLS = {0: "adapter.call:2", 1: "adapter.start_mark:2"}


async def _drive_agent(tmp: Path, warm: bool) -> tuple[Any, list[bool], list[Any], bool]:
    from durable_spaces.backends import open_backend
    from durable_spaces.campaigns.agent import AgentConfigFile
    from durable_spaces.campaigns.checker import LaunchRecord, Workload, check_all, collect

    session = tmp / "session"
    cfg = AgentConfigFile(
        backend="local", backend_dir=str(tmp / "spaces"), mode="transactional",
        seed="warm-7", calls=5, store_dir=str(tmp / "store"),
    )  # fmt: skip
    cfg.save(session)

    def arm(launch: Launch) -> None:
        launch.env["DS_FAILPOINTS"] = KILLS.get(launch.index, "")

    c = Coordinator(
        AGENT, session, "warm-agent", stall_secs=60, heartbeat_secs=2,
        backoff=(0.05, 0.05, 1.0), max_attempts=6, timeout_secs=180,
        env={"CUA_SESSION_SPACE": "warm-agent"}, before_launch=[arm], warm=warm,
    )  # fmt: skip
    r = await c.run()
    recoveries = [
        (e["epoch"], e["data"]["kind"], e["data"]["call"])
        for e in r.events
        if e["event"] == "driver_event" and e["data"]["event"] == "recovery"
    ]
    backend = open_backend("local", tmp / "spaces")
    try:
        space = await backend.find("warm-agent")
        assert space is not None
        inputs = await collect(
            space,
            session / "log.sqlite",
            workload=Workload(seed=cfg.seed, calls=cfg.calls, sleep=cfg.sleep),
            launches=LaunchRecord.from_events(r.events),
        )
        verdicts = check_all(inputs)
        for name in await backend.names():
            await backend.delete(name)
    finally:
        await backend.close()
    return (
        r,
        [a.warm for a in c.history],
        recoveries,
        all(v.get("valid") is True for v in verdicts.values()),
    )


async def test_a_warm_driver_killed_mid_call_recovers_like_a_cold_one(tmp_path: Path) -> None:
    cold, cold_warm, cold_rec, cold_ok = await _drive_agent(tmp_path / "cold", warm=False)
    hot, hot_warm, hot_rec, hot_ok = await _drive_agent(tmp_path / "warm", warm=True)
    assert cold.status == hot.status == "done"
    assert cold.exit_codes == hot.exit_codes == [-signal.SIGKILL, -signal.SIGKILL, 0]
    assert cold_warm == [False, False, False] and hot_warm == [False, True, True]
    assert hot_rec == cold_rec and hot_rec  # the same recoveries, decided the same way
    assert cold_ok and hot_ok  # the workspace is what the committed log implies


async def test_a_warm_driver_that_never_speaks_turns_spares_off(tmp_path: Path) -> None:
    # A warm_up that hangs leaves the launched spare silent: killed as stalled, and the
    # attempts after it are cold (a cold driver never runs warm_up).
    (tmp_path / "hangs_warm.py").write_text(
        "import time\n"
        "from toy_driver import main\n"
        "def warm_up(state_dir):\n"
        "    time.sleep(3600)\n"
        "if __name__ == '__main__':\n"
        "    raise SystemExit(main())\n"
    )
    path = os.pathsep.join([str(tmp_path), PATH_ENV["PYTHONPATH"]])
    c = Coordinator(
        [sys.executable, "-m", "hangs_warm"], tmp_path, "toy",
        env={"TOY_PLAN": json.dumps({"1": "crash", "default": "done"}), "PYTHONPATH": path},
        stall_secs=2.0, heartbeat_secs=0.1, backoff=(0.05, 0.5, 2), max_attempts=6,
        timeout_secs=90, warm=True,
    )  # fmt: skip
    r = await c.run()
    assert r.status == "done"
    assert [a.warm for a in c.history] == [False, True, False]
    assert r.exit_codes == [1, -signal.SIGKILL, 0] and r.stalls == 1
    assert [e["event"] for e in r.events].count("warm_off") == 1


def test_a_warm_module_runs_as_main_once_and_without_a_warning(tmp_path: Path) -> None:
    """A spare (or the zygote) imported the driver's module to warm up; run as the
    driver, it runs as ``python -m`` runs it: once as ``__main__``, with no RuntimeWarning
    from runpy on the driver's stderr (a module inside a package, as the real driver)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("import sys\nprint(__name__, 'pkg.mod' in sys.modules)\n")
    code = (
        "import pkg.mod\n"
        "from durable_spaces.drive.warm_driver import run_as_main\n"
        "run_as_main('pkg.mod')\n"
    )
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    r = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", code],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["pkg.mod True", "__main__ False"]  # warm, then main
    assert "RuntimeWarning" not in r.stderr
