"""Bad files for the tests of every reader of a file from outside
(``durable_spaces/host/bounded.py``): a FIFO, a document nested too deep, a file too big;
and ``on_a_fifo``, which runs a read of a FIFO so that a reader that waits for a writer
fails its test instead of hanging it."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Far deeper than any parser of Python's goes (they stop near a thousand).
ABYSS = 100_000


def deep_json(levels: int = ABYSS) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


def deep_toml(levels: int = ABYSS) -> bytes:
    return b"a = " + b"[" * levels + b"]" * levels + b"\n"


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no room (a reader that reads it whole reads
    zeros)."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@dataclass
class FifoRead:
    """What a read of a FIFO did: its value or error, and whether it waited for a
    writer (then the test let it go, and it read nothing)."""

    value: Any = None
    error: BaseException | None = None
    waited: bool = False


#: Where the kernel says a thread sleeps while its open of a FIFO waits for the other end.
_FIFO_WAITS = {"wait_for_partner", "fifo_open", "pipe_wait"}


def _sleeps_in_a_fifo_open(tid: int | None) -> bool | None:
    """Whether thread ``tid`` of this process sleeps in a FIFO's open (None: it sleeps,
    and the kernel does not say where)."""
    task = Path(f"/proc/self/task/{tid}")
    try:
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        where = (task / "wchan").read_text().strip()
    except (OSError, IndexError):
        return False  # it ended
    if state not in ("S", "D"):
        return False  # running: in no open that waits
    return None if where == "0" else where in _FIFO_WAITS


def on_a_fifo(fifo: Path, read: Callable[[], Any]) -> FifoRead:
    """``read()`` in a thread while ``fifo`` has no writer. ``waited``: the thread was seen
    asleep in the FIFO's open (the kernel's ``wchan``), waiting for a writer. Such a reader
    is let go by an open of the write end (it succeeds only while a reader holds the FIFO:
    ENXIO otherwise), so it reads an empty FIFO and the test fails on ``waited`` instead
    of hanging. A reader that refuses the FIFO unopened, or opens it O_NONBLOCK, never
    sleeps there. Where the kernel does not say where threads sleep, any reader found
    holding the FIFO counts as one that waited."""
    out = FifoRead()

    def run() -> None:
        try:
            out.value = read()
        except BaseException as e:  # handed to the test to assert on
            out.error = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    while t.is_alive():
        if _sleeps_in_a_fifo_open(t.native_id):
            out.waited = True
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno not in (errno.ENXIO, errno.ENOENT):  # no reader; no FIFO (yet)
                raise
            t.join(0.001)  # a poll for either event: the read ended, or a reader holds it
            continue
        if _sleeps_in_a_fifo_open(t.native_id) is not False:
            out.waited = True
        os.close(fd)  # a reader that waited reads end-of-file now, and so on, every open
        t.join(0.001)
    return out


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path
