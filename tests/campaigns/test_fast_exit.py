"""campaigns/fast_exit.py over real processes: a worker or driver ending with
``exit_now`` keeps everything the normal exit gives its parent (the code, buffered
output, ``atexit`` callbacks, non-daemon threads' work) and skips only the teardown."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROGRAM = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from pathlib import Path
    from durable_spaces.campaigns.fast_exit import exit_now

    out = Path(sys.argv[1])

    class Teardown:
        def __del__(self):  # runs only when the interpreter tears its modules down
            out.joinpath("teardown").write_text("ran")

    keep = Teardown()
    atexit.register(lambda: out.joinpath("atexit").write_text("ran"))

    def late():
        time.sleep(0.3)
        out.joinpath("thread").write_text("ran")

    threading.Thread(target=late).start()
    sys.stdout.write("buffered, no newline")
    exit_now(7)
    """
)


def run(tmp_path: Path, program: str = PROGRAM, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run(
        [sys.executable, "-c", program, str(tmp_path)],
        env={**e, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def ran(tmp_path: Path) -> set[str]:
    return {p.name for p in tmp_path.iterdir()}


def test_exit_now_keeps_the_exit_and_skips_the_teardown(tmp_path: Path) -> None:
    r = run(tmp_path)
    assert r.returncode == 7, r.stderr
    assert r.stdout == "buffered, no newline"
    assert ran(tmp_path) == {"atexit", "thread"}  # no teardown: that is the point


@pytest.mark.parametrize("why", ["knob", "sdk"])
def test_the_normal_exit_when_asked_or_when_the_sdk_is_loaded(tmp_path: Path, why: str) -> None:
    if why == "sdk":
        pytest.importorskip("cua", reason="the cua SDK is not installed")
    env = {"DS_FAST_EXIT": "0"} if why == "knob" else {}
    program = PROGRAM if why == "knob" else PROGRAM.replace("import atexit,", "import cua, atexit,")
    r = run(tmp_path, program, **env)
    assert r.returncode == 7, r.stderr
    assert r.stdout == "buffered, no newline"
    assert ran(tmp_path) == {"atexit", "thread", "teardown"}
