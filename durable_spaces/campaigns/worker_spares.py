"""The runner's spare workers: run processes started before their run, imports done.

A run's worker (``campaigns/worker.py``) spends about half a second starting Python and
importing the lab before its run begins: a fifth of a short run's wall time. The runner
keeps up to ``jobs`` spares (``worker.py --spare RUN_ONE``, the same environment and
session as a cold worker) and hands the next run to one by a line on its stdin; a new
spare is started in the background as each is taken, while the runs run. A run is still
one fresh process of its own (a spare has done nothing but import before its line), its
stdout and stderr the run's log, killed by the same ``_kill_tree``; only the start comes
sooner. A spare that died while waiting is passed over (the run is spawned cold).
``close()`` ends the spares (end of file on stdin: exit 0) and reaps them.

On unless ``DS_WARM_WORKERS=0``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from durable_spaces.drive import zygote as zy
from durable_spaces.drive.zygote import DriverProcess


@dataclass
class _Spare:
    """A waiting worker: spawned (its line goes to its stdin pipe) or forked by the
    campaign's zygote (its line goes on its socket)."""

    process: asyncio.subprocess.Process | zy.ForkedProcess
    sock: socket.socket | None = None

    def dead(self) -> bool:
        if self.process.returncode is not None:
            return True
        if isinstance(self.process, zy.ForkedProcess):
            return self.process.orphaned  # its exit code would go untold
        return self.process.stdin is None

    async def send(self, line: bytes) -> None:
        if isinstance(self.process, zy.ForkedProcess):
            assert self.sock is not None
            self.sock.send(line)
            self.sock.close()
            return
        assert self.process.stdin is not None
        self.process.stdin.write(line)
        await self.process.stdin.drain()
        self.process.stdin.close()

    def end(self) -> None:
        """A spawned one gets end of file on its stdin: it exits having done nothing. A
        forked one is killed: its socket's other end is still ours (the exit code's
        relay), so it would never read end of file."""
        if self.sock is not None:
            self.sock.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
        elif isinstance(self.process, asyncio.subprocess.Process) and self.process.stdin:
            self.process.stdin.close()


class WorkerSpares:
    """At most ``size`` spare workers of one ``ref`` (inside one event loop), and no
    more than ``total`` started in all (the runs there are to take them)."""

    def __init__(
        self, ref: str, env: Mapping[str, str], size: int, total: int, zygote: str | None = None
    ) -> None:
        self.ref = ref
        self.env = dict(env)
        self.size = size
        self.left = total
        self._ready: list[_Spare] = []
        self._starting: set[asyncio.Task[None]] = set()
        self.closed = False
        #: The campaign's zygote's socket (``drive/zygote.py``): spares forked there.
        self.zygote = zygote

    def fill(self) -> None:
        """Start spares (in the background) until ``size`` are there or on their way."""
        while (
            not self.closed and self.left > 0 and len(self._ready) + len(self._starting) < self.size
        ):
            self.left -= 1
            t = asyncio.create_task(self._start())
            self._starting.add(t)
            t.add_done_callback(self._starting.discard)

    async def _fork(self) -> _Spare | None:
        if self.zygote is None:
            return None
        argv = ["durable_spaces.campaigns.worker", "--spare", self.ref]
        # Unbuffered as the zygote is (its environment is the drivers'); a worker's
        # output goes to its run's log either way.
        env = {**self.env, "PYTHONUNBUFFERED": "1"}
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            proc, sock = await zy.fork_spare(self.zygote, argv, "", None, env,
                                             mode="main", stdout=null)  # fmt: skip
        except zy.ZygoteUnavailable:
            self.zygote = None  # spawned from now on
            return None
        finally:
            os.close(null)
        return _Spare(proc, sock)

    async def _start(self) -> None:
        spare = await self._fork()
        if spare is None:
            with contextlib.suppress(OSError):  # cannot start one: that run is spawned cold
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "durable_spaces.campaigns.worker", "--spare", self.ref,
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    env=self.env, start_new_session=True,
                )  # fmt: skip
                spare = _Spare(proc)
        if spare is None:
            return
        if self.closed:
            await self._end(spare)
        else:
            self._ready.append(spare)

    async def take(self, spec: Path, out: Path, log: Path) -> DriverProcess | None:
        """A spare launched as the run of ``spec`` (None: spawn it cold); refills."""
        line = json.dumps({"spec": str(spec), "out": str(out), "log": str(log)}) + "\n"
        while not self._ready and self._starting:
            # One on its way started sooner than a cold worker would now: wait for it
            # (again when a run beside this one took the one that came first).
            await asyncio.wait(set(self._starting), return_when=asyncio.FIRST_COMPLETED)
        try:
            while self._ready:
                spare = self._ready.pop(0)
                if spare.dead():
                    await self._end(spare)
                    continue  # died while waiting
                try:
                    await spare.send(line.encode())
                except OSError:
                    await self._end(spare)
                    continue
                return spare.process
            return None
        finally:
            self.fill()

    async def _end(self, spare: _Spare) -> None:
        spare.end()
        proc = spare.process
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def close(self) -> None:
        """End every spare (and those being started) and reap them."""
        self.closed = True
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)
        ready, self._ready = self._ready, []
        await asyncio.gather(*(self._end(p) for p in ready), return_exceptions=True)
