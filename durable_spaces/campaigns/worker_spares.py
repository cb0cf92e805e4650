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
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from durable_spaces.switches import switch

ENV = "DS_WARM_WORKERS"


def enabled_by_env(env: Mapping[str, str] | None = None) -> bool:
    """``DS_WARM_WORKERS``: ``0`` turns spare workers off; unset or ``1`` keeps them on."""
    return switch(ENV, env)


class WorkerSpares:
    """At most ``size`` spare workers of one ``ref`` (inside one event loop), and no
    more than ``total`` started in all (the runs there are to take them)."""

    def __init__(self, ref: str, env: Mapping[str, str], size: int, total: int) -> None:
        self.ref = ref
        self.env = dict(env)
        self.size = size
        self.left = total
        self._ready: list[asyncio.subprocess.Process] = []
        self._starting: set[asyncio.Task[None]] = set()
        self.closed = False

    def fill(self) -> None:
        """Start spares (in the background) until ``size`` are there or on their way."""
        while (
            not self.closed and self.left > 0 and len(self._ready) + len(self._starting) < self.size
        ):
            self.left -= 1
            t = asyncio.create_task(self._start())
            self._starting.add(t)
            t.add_done_callback(self._starting.discard)

    async def _start(self) -> None:
        with contextlib.suppress(OSError):  # cannot start one: that run is spawned cold
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "durable_spaces.campaigns.worker", "--spare", self.ref,
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
            )  # fmt: skip
            if self.closed:
                await self._end(proc)
            else:
                self._ready.append(proc)

    async def take(self, spec: Path, out: Path, log: Path) -> asyncio.subprocess.Process | None:
        """A spare launched as the run of ``spec`` (None: spawn it cold); refills."""
        line = json.dumps({"spec": str(spec), "out": str(out), "log": str(log)}) + "\n"
        if not self._ready and self._starting:
            # One on its way started sooner than a cold worker would now: wait for it.
            await asyncio.wait(set(self._starting), return_when=asyncio.FIRST_COMPLETED)
        try:
            while self._ready:
                proc = self._ready.pop(0)
                if proc.returncode is not None or proc.stdin is None:
                    continue  # died while waiting
                try:
                    proc.stdin.write(line.encode())
                    await proc.stdin.drain()
                    proc.stdin.close()
                except (BrokenPipeError, ConnectionResetError):
                    await proc.wait()
                    continue
                return proc
            return None
        finally:
            self.fill()

    async def _end(self, proc: asyncio.subprocess.Process) -> None:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def close(self) -> None:
        """End every spare (and those being started) and reap them."""
        self.closed = True
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)
        ready, self._ready = self._ready, []
        await asyncio.gather(*(self._end(p) for p in ready), return_exceptions=True)
