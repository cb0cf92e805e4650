"""The coordinator over real toy driver processes (tests/campaigns/toy_driver.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from toy_driver import launches

from durable_spaces.drive.coordinator import Coordinator, Launch, read_state
from durable_spaces.errors import PermanentFailure, SpaceUnavailableError

HERE = Path(__file__).parent
TOY = [sys.executable, str(HERE / "toy_driver.py")]


def coord(tmp_path: Path, plan: dict[str, Any], **kw: Any) -> Coordinator:
    kw.setdefault("stall_secs", 5)
    kw.setdefault("heartbeat_secs", 0.1)
    kw.setdefault("backoff", (0.05, 0.5, 2))
    kw.setdefault("max_attempts", 6)
    kw.setdefault("timeout_secs", 60)
    return Coordinator(TOY, tmp_path, "toy", env={"TOY_PLAN": json.dumps(plan)}, **kw)


async def test_crash_backoff_resume_with_next_epoch(tmp_path: Path) -> None:
    c = coord(tmp_path, {"1": "crash", "2": "crash", "default": "done"})
    r = await c.run()
    assert r.status == "done"
    assert r.epochs == [1, 2, 3]
    assert r.exit_codes == [1, 1, 0]
    assert [e for e, _ in launches(tmp_path)] == [1, 2, 3]
    backoffs = [e["delay_s"] for e in r.events if e["event"] == "backoff"]
    assert backoffs == [0.05, 0.1]  # initial, then times the factor
    assert read_state(tmp_path)["last_epoch"] == 3
    # each crash was followed by a first step of the next driver
    assert len(r.resumes) == 2
    assert all(x.cause == "crash" and x.latency_ms >= x.backoff_ms for x in r.resumes)


async def test_exit_75_is_ignored_and_next_epoch_goes_past_the_floor(tmp_path: Path) -> None:
    c = coord(tmp_path, {"1": "fenced", "floor": 5, "default": "done"})
    r = await c.run()
    assert r.status == "done"
    assert r.epochs == [1, 6]  # the fenced event said the floor is 5
    assert not any(e["event"] == "backoff" for e in r.events)  # 75 is not a crash


async def test_78_stops(tmp_path: Path) -> None:
    r = await coord(tmp_path, {"1": "crash", "default": "permanent"}).run()
    assert r.status == "failed"
    assert r.exit_codes == [1, 78]


async def test_attempt_cap(tmp_path: Path) -> None:
    r = await coord(tmp_path, {"default": "crash"}, max_attempts=3).run()
    assert r.status == "exhausted"
    assert r.epochs == [1, 2, 3]
    assert len(launches(tmp_path)) == 3


async def test_stalled_driver_is_replaced(tmp_path: Path) -> None:
    c = coord(tmp_path, {"1": "stall", "default": "done"}, stall_secs=2.0)
    t0 = time.monotonic()
    r = await c.run()
    assert r.status == "done"
    assert r.exit_codes[0] == -signal.SIGKILL
    assert r.stalls == 1
    assert r.resumes[0].cause == "stall"
    assert time.monotonic() - t0 >= 2.0


async def test_heartbeating_driver_is_not_replaced(tmp_path: Path) -> None:
    # busy but heartbeating for 3x the stall window: kept
    c = coord(tmp_path, {"default": "done"}, stall_secs=1.0)
    c.extra_env["TOY_START_SECS"] = "3.0"
    r = await c.run()
    assert r.status == "done" and r.stalls == 0 and r.epochs == [1]


async def test_kill_current_measures_resume_latency(tmp_path: Path) -> None:
    c = coord(tmp_path, {"1": "hang", "default": "done"})
    killed: list[int | None] = []

    async def killer() -> None:
        async for a in c.attempts():
            if a.index == 0:
                await asyncio.sleep(0.3)
                killed.append(c.kill_current())

    task = asyncio.create_task(killer())
    r = await c.run()
    await task
    assert killed and killed[0] == c.history[0].pid
    assert r.status == "done" and r.kills == 1
    (res,) = r.resumes
    assert res.cause == "nemesis"
    assert res.latency_ms >= res.backoff_ms == 50.0


async def test_hooks_arm_a_failpoint_and_place_space_runs_before_each_drive(
    tmp_path: Path,
) -> None:
    placed: list[int] = []

    async def place() -> None:
        placed.append(len(launches(tmp_path)))

    def arm(launch: Launch) -> None:
        launch.env["DS_FAILPOINTS"] = "toy.step:2" if launch.index == 0 else ""

    c = coord(tmp_path, {"default": "steps:3"}, place_space=place, before_launch=[arm])
    r = await c.run()
    assert r.status == "done"
    assert r.exit_codes == [-signal.SIGKILL, 0]
    steps = [
        e["data"]["n"]
        for e in r.events
        if e["event"] == "driver_event" and e["data"]["event"] == "step"
    ]
    assert steps == [1, 1, 2, 3]  # died at the second hit, then a clean run
    assert placed == [0, 1]


async def test_place_space_permanent_failure_stops(tmp_path: Path) -> None:
    async def place() -> None:
        raise PermanentFailure("no Space can be placed")

    r = await coord(tmp_path, {"default": "done"}, place_space=place).run()
    assert r.status == "failed" and r.attempts == 0 and "placed" in r.reason


def _coordinator(state: Path, plan: dict[str, Any], **env: str) -> subprocess.Popen[str]:
    e = {**os.environ, "TOY_PLAN": json.dumps(plan), **env}
    return subprocess.Popen(
        [sys.executable, str(HERE / "toy_coordinator.py"), str(state)],
        env=e,
        stdout=subprocess.PIPE,
        text=True,
    )


def _wait_for(pred: Any, timeout: float = 300) -> None:  # a hang, not a pace
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_killed_coordinator_restarts_without_reusing_an_epoch(tmp_path: Path) -> None:
    first = _coordinator(tmp_path, {"default": "hang"})
    log = tmp_path / "drivers" / "epoch-1.log"
    # past its own prints (an orphan dies on its next write to the dead coordinator's pipe)
    _wait_for(lambda: log.exists() and "first_step" in log.read_text())
    _wait_for(lambda: read_state(tmp_path).get("driver") is not None)
    orphan = read_state(tmp_path)["driver"]["pid"]
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert psutil.pid_exists(orphan)  # its driver outlived it
    second = _coordinator(tmp_path, {"1": "hang", "default": "done"})
    out, _ = second.communicate(timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "done"
    assert result["epochs"] == [2]
    assert "orphan_killed" in result["events"]
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == "zombie"
    epochs = [e for e, _ in launches(tmp_path)]
    assert epochs == [1, 2]


def test_coordinator_killed_between_issue_and_spawn_burns_the_epoch(tmp_path: Path) -> None:
    first = _coordinator(tmp_path, {"default": "done"}, DS_FAILPOINTS="coordinator.epoch_issued:1")
    first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL
    assert read_state(tmp_path)["last_epoch"] == 1 and launches(tmp_path) == []
    second = _coordinator(tmp_path, {"default": "done"})
    out, _ = second.communicate(timeout=60)
    assert json.loads(out.strip().splitlines()[-1])["epochs"] == [2]
    assert [e for e, _ in launches(tmp_path)] == [2]


def test_glued_lines_are_still_read(tmp_path: Path) -> None:
    from durable_spaces.drive.coordinator import Attempt
    from durable_spaces.drive.supervisor import Supervisor

    seen: list[str] = []
    sup = Supervisor(
        TOY, tmp_path, cwd=None, stall_secs=5, emit=lambda *a, **k: None,
        kill=lambda why: None, on_event=lambda a, e: seen.append(e["event"]),
    )  # fmt: skip
    a = Attempt(0, 1, 0, 0.0, process=None)  # type: ignore[arg-type]
    sup.line(a, 'DS-EVENT {"event":"first_step","unix_ms":5}CUA-HEARTBEAT 1 7')
    sup.line(a, 'CUA-HEARTBEAT 1 7DS-EVENT {"event":"done"}')
    assert seen == ["first_step", "done"]
    assert a.heartbeats == 2
    assert [e["event"] for e in a.events] == ["first_step", "done"]
    assert a.first_step_ms == 5


async def test_a_second_coordinator_supersedes_the_first(tmp_path: Path) -> None:
    """The stale shape: a newer driver takes over while the older one still runs; the
    older one is fenced (75) and its coordinator stops instead of fighting back."""
    first = coord(tmp_path, {"default": "until_fenced"})
    run1 = asyncio.create_task(first.run())
    await anext(first.attempts())  # subscribed before the task's first launch
    second = coord(tmp_path, {"default": "done"}, kill_orphans=False)
    # Its driver is still running when the first sees 75: it holds before its first
    # step until the first coordinator has stopped.
    start = tmp_path / "start"
    second.extra_env["TOY_START_UNTIL"] = str(start)
    run2 = asyncio.create_task(second.run())
    try:
        r1 = await run1
    finally:
        start.touch()
    r2 = await run2
    assert (r1.status, r1.epochs, r1.exit_codes) == ("superseded", [1], [75])
    assert (r2.status, r2.epochs) == ("done", [2])
    assert sorted(e for e, _ in launches(tmp_path)) == [1, 2]


async def test_a_failed_placement_is_retried_with_backoff(tmp_path: Path) -> None:
    tries: list[float] = []

    async def place() -> None:
        tries.append(time.monotonic())
        if len(tries) <= 2:
            raise SpaceUnavailableError("host down")

    r = await coord(tmp_path, {"default": "done"}, place_space=place).run()
    assert r.status == "done" and r.epochs == [3]  # epochs 1 and 2 burned, never reused
    kinds = [e["event"] for e in r.events]
    assert kinds.count("place_failed") == 2 and kinds.count("backoff") == 2
    assert tries[2] - tries[1] >= 0.1  # the second backoff doubled


async def test_placement_failures_count_against_the_cap(tmp_path: Path) -> None:
    async def place() -> None:
        raise SpaceUnavailableError("host down")

    r = await coord(tmp_path, {"default": "done"}, place_space=place, max_attempts=3).run()
    assert r.status == "exhausted" and r.attempts == 0 and launches(tmp_path) == []
