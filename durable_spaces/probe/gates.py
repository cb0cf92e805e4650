"""Kill points, and the gates that make a step's command hold at one exactly.

A point is seen from outside the harness: on the model's side, request k received (before
it is answered) and partway through answer k (model_server.py holds those); on the
workspace's side, step k's command started (before its effect), its effect done (the
command still running), and its command about to exit (task.py's command holds at each).

A gate is a FIFO in the lab's directory (outside the workdir; the command names it by its
absolute path). The command holds only when the FIFO exists, so a run makes the one gate
its kill point needs and every other step runs straight through; the lab's open of the
FIFO's write end returns when the command opens its read end, which is the moment the point
is reached. The FIFO is unlinked then, so a second run of the same command (a harness that
re-runs it) passes. The lab writes one word when it opens the gate: ``late`` after a kill,
which the effect line then carries (task.py), so an effect of a killed attempt's process
is seen as such.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from durable_spaces.host.bounded import MAX_VALUE_BYTES, read_text

__all__ = ["BLACK_BOX", "COMMAND_WHERE", "MODEL_WHERE", "STATE_WHERE", "Gate", "GatePoint"]

#: Points held by the model server, and by a step's command.
MODEL_WHERE = ("request", "stream")
COMMAND_WHERE = ("started", "effect", "exited")
BLACK_BOX = MODEL_WHERE + COMMAND_WHERE
#: Points inside the harness's own persistence (state.py): the n-th write, fsync or
#: rename it makes to its state directory; their ``step`` is that n.
STATE_WHERE = ("write", "fsync", "rename")


@dataclass(frozen=True, order=True)
class GatePoint:
    step: int  # 1..K, and K+1 for the final answer (model points); n for a state point
    where: str  # one of BLACK_BOX + STATE_WHERE

    def __str__(self) -> str:
        return f"{self.where}@{self.step}"

    @classmethod
    def parse(cls, text: str) -> GatePoint:
        where, _, step = text.partition("@")
        if where not in BLACK_BOX + STATE_WHERE or not step.isdigit() or len(step) > 6:
            raise ValueError(f"not a kill point: {text!r} (where@step, e.g. started@3)")
        return cls(int(step), where)

    @property
    def state(self) -> bool:
        return self.where in STATE_WHERE


class Gate:
    """One command point's FIFO: ``wait`` in a thread until the command reaches it,
    then ``open(word)`` lets it go on."""

    def __init__(
        self, gates_dir: Path, point: GatePoint, reached: Callable[[GatePoint], None]
    ) -> None:
        self.point = point
        self.path = gates_dir / f"{point.step}.{point.where}"
        self.pid_path = gates_dir / f"{point.step}.pid"
        self._reached = reached
        self._fd: int | None = None
        self._cancelled = False
        self._lock = threading.Lock()
        os.mkfifo(self.path, 0o600)
        self._thread = threading.Thread(target=self._wait, name=f"gate-{point}", daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY)  # returns once the command opened it
        except OSError:
            return
        with self._lock:
            if self._cancelled:
                os.close(fd)
                return
            self._fd = fd
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self._reached(self.point)

    def pid(self) -> int | None:
        """The held command's shell (it wrote ``$$`` before it opened the gate)."""
        try:
            text = read_text(self.pid_path, max_bytes=MAX_VALUE_BYTES).strip()
        except (OSError, ValueError):  # a FIFO, a device, a huge file: no pid
            return None
        return int(text) if text.isdigit() and len(text) < 10 else None

    def open(self, word: str) -> None:
        """Let the held command go on, telling it ``word``; if the point was never
        reached, unblock our own waiting open and remove the FIFO."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is None:
                self._cancelled = True
        if fd is not None:
            try:
                os.write(fd, f"{word}\n".encode())
            except OSError as e:  # the reader was killed: nothing to let go on
                if e.errno != errno.EPIPE:
                    raise
            finally:
                os.close(fd)
            return
        try:  # our own reader lets the waiting open return; it then sees _cancelled
            rfd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return
        os.close(rfd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._thread.join()
