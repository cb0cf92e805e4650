"""``server`` (microvm): a process started at step 0 survives a machine checkpoint's restore.

The script's step 0 starts a heartbeat "server" outside the workspace, and every shell
step sleeps 4 s so a command is still running when its driver is killed. The schedule
kills a driver right after a machine checkpoint, then the next one in the middle of a
call (its outcome unknown), so the one after restores that checkpoint; the server must
come back with it: the same pid, still beating (``checks/server_survives.py``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from durable_spaces.campaigns.checks.server_survives import server_survives
from durable_spaces.campaigns.evidence import RunCheck, on_inputs
from durable_spaces.campaigns.scenarios.base import OneSession, Script
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.chaos import points
from durable_spaces.chaos.schedule import AttemptPlan, Failpoint, Schedule

#: Seconds each scripted shell command sleeps: still running when its driver dies.
SLEEP_S = 4.0


class Server(OneSession):
    name = "server"

    def script(self, run: RunSpec) -> Script:
        return Script(run.seed, SLEEP_S, server=True)

    def schedule(self, run: RunSpec) -> Schedule:
        rng = random.Random(f"{run.seed}:server")
        after = Failpoint(points.ADAPTER_CHECKPOINT, rng.randint(2, max(2, run.calls - 2)))
        mid = Failpoint(points.ADAPTER_MID_CALL, 1)
        plans = (AttemptPlan(failpoint=after), AttemptPlan(failpoint=mid))
        return Schedule(run.seed, plans, "server")

    def checks(self) -> Mapping[str, RunCheck]:
        return {"server_survives": on_inputs(server_survives)}


SCENARIO = Server()
