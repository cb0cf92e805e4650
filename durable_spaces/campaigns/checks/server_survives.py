"""``server_survives``: the process the workload started at step 0 came back with the
restore, the same process, still beating.

The ``server`` workload's step 0 starts a heartbeat loop outside the workspace (its pid
in ``/tmp/ds-server.pid``, the time in ``/tmp/ds-server.beat`` every 0.2 s) and its
committed result reports its pid (read by ``workload.server_started``). After the
run ``probe`` asks the Space for the pid in the file, whether it runs (``kill -0``) and
how old its last beat is. A machine restore brings back the same process, not a new one:
the pid must be the one started, and the beat at most ``MAX_BEAT_AGE_S`` old.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_spaces.campaigns.checks.inputs import ServerProbe
from durable_spaces.campaigns.checks.verdict import Verdict, passed
from durable_spaces.campaigns.checks.workload import (
    SERVER_BEAT_FILE,
    SERVER_PID_FILE,
    server_started,
)
from durable_spaces.space import Space

if TYPE_CHECKING:
    from durable_spaces.campaigns.checks.inputs import Inputs

PROBE = (
    f"p=$(cat {SERVER_PID_FILE}) && kill -0 $p && b=$(cat {SERVER_BEAT_FILE}) && "
    'echo "$p $(( $(date +%s) - b ))"'
)
MAX_BEAT_AGE_S = 3


async def probe(space: Space) -> ServerProbe:
    res = await space.exec(["sh", "-c", PROBE], key=None, epoch=await space.current_epoch())
    return ServerProbe(res.exit_code, res.output.decode(errors="replace"))


def _invalid(detail: str) -> Verdict:
    return {"valid": False, "detail": detail, "anomalies": []}


def server_survives(inputs: Inputs) -> Verdict:
    started = server_started(inputs.history)
    if started is None:
        return _invalid("the server's start has no committed result")
    seen = inputs.server
    if seen is None:
        return _invalid("the server was not probed after the run")
    out = seen.output.split()
    if seen.exit_code != 0 or len(out) != 2:
        return _invalid(f"server not running: {seen.output[-200:]!r}")
    pid, age = int(out[0]), int(out[1])
    if pid != started:
        return _invalid(f"server pid {pid} is not the one started ({started})")
    if age > MAX_BEAT_AGE_S:
        return _invalid(f"server alive but its last beat is {age} s old")
    return passed(f"server pid {pid} alive, beat {age} s ago")
