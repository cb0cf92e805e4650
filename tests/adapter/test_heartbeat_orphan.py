"""A driver whose coordinator died: its heartbeats hit a closed pipe. Nobody supervises it
any more, so it stops at once with one line (exit 75, as a superseded driver), never a
thread traceback and never running on unsupervised."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import sys, time
from durable_spaces.drive.entry import Heartbeat
with Heartbeat(1, 0.02):
    time.sleep(3600.0)  # only the closed pipe can end this in time for the test
print("still here", file=sys.stderr)
"""


def test_a_closed_heartbeat_pipe_stops_the_driver_with_one_line() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"CUA-HEARTBEAT 1 ")
    proc.stdout.close()  # the coordinator is gone
    # The event is its exit, 75 with its line: it never outlives its pipe (a hang would
    # end at the hold's 600 s, not a bound on how fast it must stop).
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 75, err
    assert b"orphaned: the coordinator's pipe closed" in err
    assert b"still here" not in err
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
