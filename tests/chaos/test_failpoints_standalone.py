"""``chaos/failpoints.py`` is loaded alone, outside the package, by the local fork server
(``backends/local/forkserver.py``: ``python -I -S``, no ``durable_spaces`` on the path)
when failpoints are armed: an import of the package there made every armed fork server
fail to start, and the lab's local Spaces ran without one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import durable_spaces.chaos.failpoints as fp

LOAD = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('ds_failpoints', sys.argv[1])\n"
    "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
    "m.hit('adapter.call'); print('loaded', m._off)\n"
)


def test_failpoints_load_alone_with_nothing_of_the_package(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "DS_FAILPOINTS": "adapter.exit:9",
           "DS_MUTANTS": "failpoints_off"}  # fmt: skip
    r = subprocess.run([sys.executable, "-I", "-S", "-c", LOAD, fp.__file__], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "loaded True"
