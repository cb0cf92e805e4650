"""A driver whose coordinator died: its heartbeats hit a closed pipe. It must go on quietly
(its fence still guards the Space), not print a thread traceback on every stop."""

from __future__ import annotations

import subprocess
import sys
import time

CHILD = """
import sys, time
from durable_spaces.adapter.driver import Heartbeat
with Heartbeat(1, 0.02):
    time.sleep(1.0)
print("still here", file=sys.stderr)
"""


def test_a_closed_heartbeat_pipe_is_quiet_and_the_driver_goes_on() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"CUA-HEARTBEAT 1 ")
    proc.stdout.close()  # the coordinator is gone
    time.sleep(0.2)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert b"still here" in err
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
