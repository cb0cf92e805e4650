"""Ending a lab process without the interpreter's teardown.

A campaign's worker (``campaigns/worker.py``) and its scripted driver
(``campaigns/agent.py``) are done when their ``main`` returns: the run's record is
written, or the session's log is closed. Their parents wait for the exit before the next
step (the runner's next run, the coordinator's end of the session), and tearing down an
interpreter that imported the lab (every module, the last collection) lengthened that
wait, per run, for nothing anyone reads (docs/performance.md).

``exit_now`` runs the ``atexit`` callbacks, flushes stdout and stderr, then ends the
process with ``os._exit``. It takes the normal exit instead while, after those
callbacks, a thread other than the main one and not a daemon is alive (the normal exit
first tells such threads to stop, e.g. an idle ``ThreadPoolExecutor``'s workers, then
waits for them: joining them without that telling hung a checkpoint-mode driver for
good), and in a process that loaded the
cua SDK (the spacesd, docker and microvm backends), whose native library may register
clean-ups of its own that ``os._exit`` would skip.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int, fast: bool = True) -> NoReturn:
    """Exit with ``code`` (see the module doc); ``fast`` False (``LabSettings.fast_exit``:
    ``DS_FAST_EXIT=0``) always the normal way (to compare, or to debug a teardown)."""
    # The callbacks first: one may end the threads it started (the checkpoint store's
    # fsync pool, adapter/checkpoints/batch.py), and they run once either way.
    atexit._run_exitfuncs()
    main = threading.main_thread()
    threads = any(t is not main and not t.daemon for t in threading.enumerate())
    if threads or not fast or "cua" in sys.modules:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
