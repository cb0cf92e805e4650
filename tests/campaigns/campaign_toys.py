"""Toy ``run_one`` sessions for runner tests (module-level: worker processes import them).

``toy_session`` is a small real campaign session: a Coordinator re-drives the toy driver
(``steps:<calls>``), each attempt armed from the run's schedule (failpoint via the
environment, random-time kills through the kill nemesis). Its planted bug: a run whose
driver was killed at the third step or later "fails" the ``toy_bug`` check.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from durable_spaces.campaigns.inject import Injector
from durable_spaces.campaigns.record import Check, RunRecord
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.chaos.nemesis import DriverKiller, compose
from durable_spaces.chaos.schedule import Schedule
from durable_spaces.drive.coordinator import Coordinator

HERE = Path(__file__).parent
POINTS = ["toy.step"]


async def toy_session(run: RunSpec) -> RunRecord:
    sched = run.schedule or Schedule.draw(run.seed, POINTS, run.calls, run.profile)
    c = Coordinator(
        [sys.executable, str(HERE / "toy_driver.py")],
        run.state_dir,
        run.run_id,
        stall_secs=10,
        heartbeat_secs=0.2,
        backoff=(0.02, 0.1, 2),
        max_attempts=10,
        env={"TOY_PLAN": json.dumps({"default": f"steps:{run.calls}"})},
        timeout_secs=60,
    )
    inj = Injector(c, sched, compose({"kill": DriverKiller(c)}))
    task = asyncio.create_task(inj.run())
    res = await c.run()
    await task
    got = inj.injected(res)
    steps_at_death = [
        max([e["n"] for e in a.events if e.get("event") == "step"], default=0)
        for a in c.history
        if a.exit_code not in (0, None)
    ]
    bug = any(n >= 2 for n in steps_at_death)  # killed at the 3rd step or later
    return RunRecord(
        run_id=run.run_id,
        seed=run.seed,
        mode=run.mode,
        backend=run.backend,
        calls=run.calls,
        schedule=sched.to_json(),
        faults=got.faults,
        kills=got.kills,
        recoveries={"resumed": max(0, res.attempts - 1)},
        attempts=got.attempts,
        resume_latencies_ms=got.resume_latencies_ms,
        checks={
            "finished": Check(valid=res.status == "done", detail=res.status),
            "toy_bug": Check(valid=not bug, detail=f"killed at steps {steps_at_death}"),
        },
        durable_mode=run.durable_mode,
    ).settle()


async def always_ok(run: RunSpec) -> RunRecord:
    return RunRecord(
        run.run_id,
        run.seed,
        run.mode,
        run.backend,
        run.calls,
        recoveries={"adopted": 1},
        resume_latencies_ms=[10.0, 20.0],
    ).settle()


async def fails_on_seed_1(run: RunSpec) -> RunRecord:
    bad = run.seed.endswith("-1")
    return RunRecord(
        run.run_id,
        run.seed,
        run.mode,
        run.backend,
        run.calls,
        kills=1,
        checks={"exactly_once": Check(valid=not bad, detail="step 2 twice" if bad else "")},
    ).settle()


async def raises(run: RunSpec) -> RunRecord:
    raise RuntimeError("harness broke")


async def hangs(run: RunSpec) -> RunRecord:
    """A run whose driver never finishes (for the runner's timeout)."""
    c = Coordinator(
        [sys.executable, str(HERE / "toy_driver.py")],
        run.state_dir,
        run.run_id,
        stall_secs=60,
        heartbeat_secs=0.2,
        env={"TOY_PLAN": json.dumps({"default": "hang"})},
    )
    await c.run()
    raise AssertionError("unreachable")


async def traced(run: RunSpec) -> RunRecord:
    """A run whose one attempt passed two failpoints (its trace story, as run.py keeps it)."""
    story = {"attempt": 0, "epoch": 1, "exit_code": 0, "calls": [], "ended_at": None,
             "hits": {"adapter.call": 1, "adapter.spawn": 1}}  # fmt: skip
    return RunRecord(
        run.run_id, run.seed, run.mode, run.backend, run.calls, extra={"trace": [story]}
    ).settle()
