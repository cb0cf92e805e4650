"""``host.inotify``: the first ``INotify`` of a process starts no subprocess (no
``ldconfig -p`` from ``find_library``) and still sees events."""

from __future__ import annotations

import subprocess
import sys

_CODE = """
import os, subprocess, tempfile
def refuse(*a, **k):
    raise AssertionError(f"a subprocess was started: {a!r}")
subprocess.Popen = refuse
from durable_spaces.host.inotify import INotify, flags
d = tempfile.mkdtemp()
with INotify() as ino:
    ino.add_watch(d, flags.CREATE)
    open(os.path.join(d, "x"), "w").close()
    print([e.name for e in ino.read(timeout=5000)])
"""


def test_the_first_inotify_starts_no_subprocess_and_sees_events() -> None:
    r = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['x']"
