"""Ending a lab process without the interpreter's teardown.

A campaign's worker (``campaigns/worker.py``) and its scripted driver
(``campaigns/agent.py``) are done when their ``main`` returns: the run's record is
written, or the session's log is closed. Their parents wait for the exit before the next
step (the runner's next run, the coordinator's end of the session), and tearing down an
interpreter that imported the lab (every module, the last collection) took 30-140 ms of
that wait, per run, on a loaded machine, for nothing anyone reads.

``exit_now`` does what the normal exit does up to the teardown, in the same order: it
waits for non-daemon threads, runs the ``atexit`` callbacks, flushes stdout and stderr,
then ends the process with ``os._exit``. A process that loaded the cua SDK (the spacesd,
docker and microvm backends) exits the normal way: its native library may register
clean-ups of its own, which ``os._exit`` would skip.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

#: Set to ``0`` to always exit the normal way (to compare, or to debug a teardown).
ENV = "DS_FAST_EXIT"


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` (see the module doc)."""
    if os.environ.get(ENV, "1").strip() == "0" or "cua" in sys.modules:
        sys.exit(code)
    main = threading.main_thread()
    for t in threading.enumerate():
        if t is not main and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
