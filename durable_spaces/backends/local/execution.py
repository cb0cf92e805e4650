"""A command of a ``local`` Space, as its caller follows it: started, reattached to (by
key, from another driver), or replayed from the ledger.

The command runs under its supervisor (``supervisor.py``), which outlives the caller; a
follower reads ``cmds/<id>/output`` from offset 0 until ``status`` appears, and learns of
the supervisor's exit at once through a pidfd (polling, doubling up to ``_POLL_MAX``,
is the fallback). A supervisor that died without a status is a lost command: the Space
says why (``LostError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from durable_spaces.backends.local.disk import read_json
from durable_spaces.backends.local.procs import alive, reap
from durable_spaces.space import BoundedOutput, ExecResult

_POLL_MIN, _POLL_MAX = 0.002, 0.05

#: What a lost command's waiter raises, given the execution: the Space's verdict (gone,
#: fenced by a newer driver, or its machine stopped).
LostError = Callable[["LocalExecution"], Awaitable[BaseException]]


class LocalExecution:
    """A command started, reattached to, or replayed by a ``LocalSpace``."""

    def __init__(
        self,
        lost: LostError,
        key: str | None,
        cmd_dir: Path,
        pid: int | None,
        ctime: float,
        *,
        popen: subprocess.Popen[bytes] | None = None,
        reattached: bool = False,
        replay: ExecResult | None = None,
        epoch: int | None = None,
        keep_output: int | None = None,
    ) -> None:
        self.key = key
        self.epoch = epoch
        self.pid = pid
        self.reattached = reattached
        self.replayed = replay is not None
        self._lost_error = lost
        self._dir = cmd_dir
        self._ctime = ctime
        self._popen = popen
        self._replay = replay
        self._collected = BoundedOutput(keep_output)
        self._gen: AsyncIterator[bytes] | None = None
        self._detached = False
        self._lost = False

    async def output(self) -> AsyncIterator[bytes]:
        if self._gen is None:
            self._gen = self._follow()
        async for chunk in self._gen:
            self._collected.add(chunk)
            yield chunk

    async def _follow(self) -> AsyncIterator[bytes]:
        if self._replay is not None:
            if self._replay.output:
                yield self._replay.output
            return
        try:
            fd = os.open(self._dir / "output", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._lost = True
            return
        exited = asyncio.Event()
        pidfd = self._watch_exit(exited)
        try:
            interval = _POLL_MIN
            while not self._detached:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    yield chunk
                    interval = _POLL_MIN
                    continue
                if (self._dir / "status").exists():
                    while chunk := os.read(fd, 1 << 16):
                        yield chunk
                    return
                if self._popen is not None:
                    self._popen.poll()
                if self.pid is None or not alive(self.pid, self._ctime):
                    if (self._dir / "status").exists():
                        continue  # it finished between our two looks: drain
                    while chunk := os.read(fd, 1 << 16):
                        yield chunk
                    self._lost = True
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(exited.wait(), interval)
                interval = min(interval * 2, _POLL_MAX)
        finally:
            os.close(fd)
            if pidfd is not None:
                asyncio.get_running_loop().remove_reader(pidfd)
                os.close(pidfd)

    def _watch_exit(self, exited: asyncio.Event) -> int | None:
        """Set ``exited`` the moment the supervisor exits (a pidfd works for any process,
        not only our children), so the end of a command is seen without polling delay."""
        if self.pid is None or not hasattr(os, "pidfd_open"):
            return None
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            return None  # already gone: the polling loop notices
        if not alive(self.pid, self._ctime):  # opened after the pid was reused
            os.close(pidfd)
            return None
        asyncio.get_running_loop().add_reader(pidfd, exited.set)
        return pidfd

    async def wait(self) -> ExecResult:
        if self._replay is not None:
            return self._replay
        async for _ in self.output():
            pass
        if self._detached:
            raise RuntimeError("wait() after detach()")
        if self._lost:
            raise await self._lost_error(self)
        status = read_json(self._dir / "status") or {}
        if self._popen is not None:
            self._popen.wait()
            reap()
        if self.key is None:
            shutil.rmtree(self._dir, ignore_errors=True)
        return ExecResult(
            key=self.key,
            exit_code=status.get("exit_code"),
            signal=status.get("signal"),
            output=self._collected.value(),
            reattached=self.reattached,
            output_bytes=self._collected.total,
        )

    async def detach(self) -> None:
        self._detached = True
