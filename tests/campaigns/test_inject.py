"""The injector carries a schedule out against a real coordinated toy session."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from durable_spaces.campaigns.inject import Injector
from durable_spaces.chaos.nemesis import DriverKiller, SpaceNemesis, compose
from durable_spaces.chaos.schedule import AttemptPlan, Failpoint, Schedule, SpaceFault
from durable_spaces.drive.coordinator import Coordinator

HERE = Path(__file__).parent


class RecordingBackend:
    """The fault half of a SpaceBackend, recording what was done and when."""

    kind = "recording"

    def __init__(self, c: Coordinator) -> None:
        self.c = c
        self.calls: list[tuple[str, int]] = []  # (what, attempts launched so far)

    async def restart(self, name: str) -> None:
        self.calls.append(("restart", len(self.c.history)))

    async def kill_daemon(self, name: str) -> None:
        self.calls.append(("kill_daemon", len(self.c.history)))

    async def delete(self, name: str) -> None:
        self.calls.append(("delete", len(self.c.history)))


async def test_schedule_is_carried_out_and_counted_from_what_happened(tmp_path: Path) -> None:
    sched = Schedule(
        "inj-1",
        (
            AttemptPlan(
                Failpoint("toy.step", 2), (), (SpaceFault("space_remove", trigger="after_kill"),)
            ),
            AttemptPlan(None, (0.05,), (SpaceFault("daemon_kill", at_s=0.01),)),
            AttemptPlan(None, (), (SpaceFault("space_restart", at_s=30.0),)),  # never lands
        ),
    )
    c = Coordinator(
        [sys.executable, str(HERE / "toy_driver.py")],
        tmp_path,
        "inj",
        stall_secs=10,
        heartbeat_secs=0.1,
        backoff=(0.02, 0.1, 2),
        max_attempts=6,
        env={"TOY_PLAN": json.dumps({"default": "steps:4"})},
        timeout_secs=60,
    )
    backend = RecordingBackend(c)
    nem = compose([DriverKiller(c), SpaceNemesis(backend, "ds-inj")])  # type: ignore[arg-type]
    inj = Injector(c, sched, nem)
    # the second driver never gets to its first step (its gate is never opened): the
    # kill at 0.05 s surely lands before it
    never = str(tmp_path / "never")
    c.before_launch.append(
        lambda launch: launch.env.update(TOY_START_UNTIL=never) if launch.index == 1 else None
    )
    import asyncio

    task = asyncio.create_task(inj.run())
    res = await c.run()
    await task
    assert res.status == "done" and res.attempts == 3
    # removed after the failpoint death, before the second launch; daemon killed during it
    assert backend.calls == [("delete", 1), ("kill_daemon", 2)]
    got = inj.injected(res)
    assert got.kills == 2
    assert got.faults == {"daemon_kill": 1, "kill": 2, "space_remove": 1}
    # the second driver was killed before its first step: one resume, from the first
    # death (a failpoint: the driver died by itself) to the third driver's first step
    (r,) = res.resumes
    assert (r.cause, r.attempts, r.backoff_ms) == ("crash", 2, 60.0)
    assert got.resume_latencies_ms == [r.latency_ms] and got.resume_backoffs_ms == [60.0]
    assert r.latency_excl_backoff_ms > 0
