"""``server_survives`` (the server scenario's check, ``campaigns/checks/server_survives.py``) on a
real log whose step 0 started the server, against what the probe saw after the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from checker_scenes import Scene, scene

from durable_spaces.campaigns.checks.inputs import ServerProbe
from durable_spaces.campaigns.checks.server_survives import server_survives
from durable_spaces.campaigns.evidence import Evidence, judge
from durable_spaces.campaigns.scenarios.base import get
from durable_spaces.campaigns.spec import RunSpec

START = "call-server-srv-1"


def _started(tmp: Path, pid: int | None) -> Scene:
    s = scene(tmp, finish=False)
    if pid is not None:
        tc = {"id": START, "name": "bash", "args": {"command": "sh -c '...' & echo ..."}}
        s.t.commit([s.t._entry("assistant", {"content": "", "tool_calls": [tc]})])
        data = {"call_id": START, "name": "bash", "status": "ok",
                "content": f"ds-server pid {pid}\n"}  # fmt: skip
        s.t.commit([s.t._entry("tool_result", data)])
    s.t.done()
    return s


CASES = {
    "alive": (4242, ServerProbe(0, "4242 1\n"), True, "server pid 4242 alive, beat 1 s ago"),
    "another-process": (4242, ServerProbe(0, "77 0\n"), False, "is not the one started (4242)"),
    "stopped-beating": (4242, ServerProbe(0, "4242 9\n"), False, "last beat is 9 s old"),
    "not-running": (4242, ServerProbe(1, "cat: no such file\n"), False, "server not running"),
    "never-started": (None, ServerProbe(0, "4242 0\n"), False, "has no committed result"),
    "not-probed": (4242, None, False, "not probed"),
}


@pytest.mark.parametrize(("pid", "seen", "valid", "detail"), CASES.values(), ids=CASES.keys())
def test_server_survives(
    pid: int | None, seen: ServerProbe | None, valid: bool, detail: str, tmp_path: Path
) -> None:
    inputs = _started(tmp_path, pid).inputs()
    inputs.server = seen
    v = server_survives(inputs)
    assert v["valid"] is valid and detail in v["detail"], v


def test_in_the_server_scenario_s_composition_a_garbled_probe_is_unknown(tmp_path: Path) -> None:
    inputs = _started(tmp_path, 4242).inputs()
    inputs.server = ServerProbe(0, "x y\n")
    checks = get("server").checks()
    v = judge(Evidence("ds-x", True, "done", inputs=inputs), checks)["server_survives"]
    assert v["valid"] is None and "ValueError" in v["detail"]


def test_the_server_schedule_and_script() -> None:
    server = get("server")
    run = RunSpec("r", "srv-3", "server", "microvm", 6, "checkpoint")
    s = server.schedule(run)
    assert [a.failpoint.name for a in s.attempts if a.failpoint] == [
        "adapter.checkpoint",
        "adapter.mid_call",
    ]
    assert 2 <= s.attempts[0].failpoint.n <= 4  # type: ignore[union-attr]
    assert server.script(run).server and server.script(run).sleep == 4.0
