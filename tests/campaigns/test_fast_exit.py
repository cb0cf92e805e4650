"""campaigns/fast_exit.py over real processes: a worker or driver ending with
``exit_now`` keeps everything the normal exit gives its parent (the code, buffered
output, ``atexit`` callbacks) and skips only the teardown; with a live non-daemon thread
(an idle pool's, say) it exits the normal way, never hanging."""

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
    from durable_spaces.campaigns.spec import LabSettings

    out = Path(sys.argv[1])

    class Teardown:
        def __del__(self):  # runs only when the interpreter tears its modules down
            out.joinpath("teardown").write_text("ran")

    keep = Teardown()
    atexit.register(lambda: out.joinpath("atexit").write_text("ran"))

    def late():  # alive when exit_now looks, however late: it ends once the exit began
        while threading.main_thread().is_alive():
            time.sleep(0.01)
        out.joinpath("thread").write_text("ran")

    if "thread" in sys.argv[2:]:
        threading.Thread(target=late).start()
    if "pool" in sys.argv[2:]:  # an idle pool's workers: told to stop, then joined
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(2)  # kept: its idle workers wait on its queue
        pool.submit(lambda: out.joinpath("pool").write_text("ran")).result()
    if "fsync" in sys.argv[2:]:  # the checkpoint store's pool: ended by its atexit
        import os
        from durable_spaces.adapter.checkpoints import batch as checkpoint_batch
        fds = [os.open(out / n, os.O_CREAT | os.O_WRONLY) for n in ("a", "b")]
        checkpoint_batch.fsync_all(fds)
        assert any(t.name.startswith("ds-fsync") for t in threading.enumerate())
        for fd in fds:
            os.close(fd)
    sys.stdout.write("buffered, no newline")
    exit_now(7, LabSettings.from_env().fast_exit)
    """
)


def run(
    tmp_path: Path, program: str = PROGRAM, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run(
        [sys.executable, "-c", program, str(tmp_path), *args],
        env={**e, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def ran(tmp_path: Path) -> set[str]:
    return {p.name for p in tmp_path.iterdir()}


def test_exit_now_keeps_the_exit_and_skips_the_teardown(tmp_path: Path) -> None:
    r = run(tmp_path)
    assert r.returncode == 7, r.stderr
    assert r.stdout == "buffered, no newline"
    assert ran(tmp_path) == {"atexit"}  # no teardown: that is the point


@pytest.mark.parametrize("threads", ["thread", "pool"])
def test_a_live_thread_gets_the_normal_exit(tmp_path: Path, threads: str) -> None:
    # A worker of an idle pool waits for the exit to tell it to stop: joining it
    # without that would hang for good (the timeout would fail the test).
    r = run(tmp_path, PROGRAM, threads)
    assert r.returncode == 7, r.stderr
    assert r.stdout == "buffered, no newline"
    assert ran(tmp_path) == {"atexit", threads, "teardown"}


@pytest.mark.parametrize("why", ["knob", "sdk"])
def test_the_normal_exit_when_asked_or_when_the_sdk_is_loaded(tmp_path: Path, why: str) -> None:
    if why == "sdk":
        pytest.importorskip("cua", reason="the cua SDK is not installed")
    env = {"DS_FAST_EXIT": "0"} if why == "knob" else {}
    program = PROGRAM if why == "knob" else PROGRAM.replace("import atexit,", "import cua, atexit,")
    r = run(tmp_path, program, **env)
    assert r.returncode == 7, r.stderr
    assert r.stdout == "buffered, no newline"
    assert ran(tmp_path) == {"atexit", "teardown"}


def test_the_checkpoint_stores_fsync_pool_does_not_cost_the_teardown(tmp_path: Path) -> None:
    # Its workers idle at the end of every checkpoint-mode driver; its atexit callback
    # ends them, so the exit stays fast (without it: "teardown" ran, 70-120 ms a run).
    r = run(tmp_path, PROGRAM, "fsync")
    assert r.returncode == 7, r.stderr
    assert r.stdout == "buffered, no newline"
    assert ran(tmp_path) == {"atexit", "a", "b"}
