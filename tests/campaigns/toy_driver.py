"""A toy driver entry for coordinator tests: a real process honouring the driver contract.

``TOY_PLAN`` (JSON) maps an epoch (as a string) or ``"default"`` to a behaviour:
``done``, ``crash`` (exit 1), ``fenced`` (exit 75), ``permanent`` (exit 78), ``hang``
(heartbeats forever), ``stall`` (silent forever), ``steps:N`` (N steps, each a
``toy.step`` failpoint hit, then done), ``until_fenced`` (runs until the coordinator
file records a newer epoch's driver, then exits 75 as a fenced driver would). Every
launch is appended to ``<state_dir>/launches.log`` as ``"<epoch> <pid>"`` before
anything else.
``TOY_QUIET_UNTIL``: a file; silent until it exists (a start as slow as the test wants);
``TOY_START_UNTIL``: a file; heartbeats until it exists, before its first step;
``TOY_START_SECS``: seconds of heartbeats before its first step (a driver busy for a time:
what a stall window is measured against).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from durable_spaces.chaos import failpoints

_out = threading.Lock()


def say(line: str) -> None:
    """One line per write, under a lock: threads must not interleave lines."""
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def launches(state_dir: Path) -> list[tuple[int, int]]:
    """The ``(epoch, pid)`` of every launch so far, as the drivers logged them."""
    p = state_dir / "launches.log"
    if not p.exists():
        return []
    return [(int(a), int(b)) for a, b in (ln.split() for ln in p.read_text().splitlines())]


def event(**fields: object) -> None:
    say("DS-EVENT " + json.dumps({**fields, "unix_ms": int(time.time() * 1000)}))


def until(variable: str) -> None:
    """Wait until the file ``variable`` names exists (no variable: no wait)."""
    path = os.environ.get(variable)
    while path and not os.path.exists(path):
        time.sleep(0.01)


def newer_driver(state: dict[str, object], epoch: int) -> bool:
    """Whether the coordinator's state records a driver of an epoch after ``epoch``."""
    driver = state.get("driver")
    return isinstance(driver, dict) and int(driver["epoch"]) > epoch


def main() -> int:
    epoch = int(os.environ["CUA_SESSION_EPOCH"])
    state_dir = os.environ["CUA_SESSION_STATE_DIR"]
    hb = float(os.environ["CUA_SESSION_HEARTBEAT_SECS"])
    fd = os.open(os.path.join(state_dir, "launches.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{epoch} {os.getpid()}\n".encode())
    os.fsync(fd)
    os.close(fd)
    plan = json.loads(os.environ.get("TOY_PLAN", "{}"))
    what = str(plan.get(str(epoch), plan.get("default", "done")))
    if what == "stall":
        time.sleep(3600)
        return 1

    until("TOY_QUIET_UNTIL")  # a slow start: silent

    def beat() -> None:
        while True:
            say(f"CUA-HEARTBEAT {epoch} {int(time.time() * 1000)}")
            time.sleep(hb)

    threading.Thread(target=beat, daemon=True).start()
    until("TOY_START_UNTIL")
    time.sleep(float(os.environ.get("TOY_START_SECS", "0")))
    event(event="first_step", epoch=epoch)
    if what == "hang":
        time.sleep(3600)
    if what == "until_fenced":
        # As a real driver is fenced: by a newer epoch's driver, once it runs (recorded),
        # not by the epoch's issue alone.
        state = os.path.join(state_dir, "coordinator.json")
        while not newer_driver(json.loads(Path(state).read_text()), epoch):
            time.sleep(0.02)
        what = "fenced"
    if what.startswith("steps:"):
        for i in range(int(what.split(":")[1])):
            failpoints.hit("toy.step")
            event(event="step", epoch=epoch, n=i + 1)
            time.sleep(0.02)
        what = "done"
    if what == "fenced":
        event(event="fenced", epoch=epoch, floor=int(plan.get("floor", epoch)))
    event(event="exit", epoch=epoch, what=what)
    return {"done": 0, "crash": 1, "fenced": 75, "permanent": 78}[what]


if __name__ == "__main__":
    sys.exit(main())
