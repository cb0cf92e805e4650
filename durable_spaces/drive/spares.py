"""A coordinator's spare driver: one pre-started process that the next attempt takes.

The contract with the spare is ``durable_spaces/drive/warm_launch.py``; the process side is
``drive/warm_driver.py``. Here is the coordinator's side (``supervisor.Supervisor``
uses it):

- ``refill(env)`` starts a spare after a launch, with that launch's environment minus
  the variables read at run time (the spare has no epoch: it learns it at launch);
- ``take(launch, stderr)`` hands the spare the attempt (epoch, environment, argv, the
  epoch's log as stderr) and returns its process, or None when the attempt must be
  spawned cold: no spare yet, the spare died while waiting, or the launch's environment
  differs from the spare's in a variable read at import;
- a spare that dies while waiting is replaced; after ``MAX_LOSSES`` deaths in a row the
  coordinator stops keeping one (a spare that cannot start would otherwise be restarted
  for ever) and every attempt is cold;
- a warm attempt that never printed a line before being killed as stalled (a
  ``warm_up`` that hangs, say) makes the coordinator ``give_up`` on spares: a cold
  driver never runs ``warm_up``, so warm attempts must not be what keeps failing;
- ``close()`` kills and reaps the spare: none outlives its coordinator. A coordinator
  that dies without closing leaves the spare reading end of file on its socket: it exits
  without having done anything.

Switched on by default; ``DS_WARM_DRIVERS=0`` (or ``Coordinator(warm=False)``) turns it
off.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from durable_spaces.drive import warm_launch as wl
from durable_spaces.drive import zygote as zy

MAX_LOSSES = 3


@dataclass
class Spare:
    process: zy.DriverProcess
    sock: socket.socket
    env: dict[str, str]
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class Spares:
    """At most one spare for one coordinator's ``argv``."""

    def __init__(
        self,
        argv: Sequence[str],
        state_dir: str | os.PathLike[str],
        *,
        cwd: str | Path | None,
        emit: Callable[..., None],
        zygote: str | None = None,
    ) -> None:
        self.spare_argv = wl.spare_argv(argv, state_dir)
        self.module_argv = list(argv[2:])
        self.state_dir = os.fspath(state_dir)
        #: The campaign's zygote's socket (``drive/zygote.py``; ``Settings.zygote_socket``):
        #: spares forked there, not spawned.
        self.zygote = zygote
        self.cwd = cwd
        self._emit = emit
        self._spare: Spare | None = None
        self._starting: asyncio.Task[None] | None = None
        self._env: dict[str, str] | None = None
        self._losses = 0
        self._discarding: set[asyncio.Task[None]] = set()
        self.closed = False

    @property
    def forks(self) -> bool:
        """Spares come from the zygote: a fork, so the first attempt takes one too."""
        return self.zygote is not None and self.usable

    @property
    def usable(self) -> bool:
        return self.spare_argv is not None and not self.closed and self._losses < MAX_LOSSES

    def refill(self, launch_env: Mapping[str, str]) -> None:
        """Start a spare for launches like this one (in the background)."""
        self._env = wl.spare_env(launch_env)
        if self.usable and self._spare is None and self._starting is None:
            self._starting = asyncio.create_task(self._start())

    async def _fork(self) -> Spare | None:
        """A spare from the zygote, or None (then it is spawned)."""
        assert self._env is not None
        if self.zygote is None:
            return None
        try:
            proc, sock = await zy.fork_spare(
                self.zygote, self.module_argv, self.state_dir, self.cwd, self._env
            )
        except zy.ZygoteUnavailable as e:
            self.zygote = None  # this coordinator's spares are spawned from now on
            self._emit("zygote_off", 0, reason=str(e)[:300])
            return None
        return Spare(proc, sock, dict(self._env))

    async def _start(self) -> None:
        try:
            assert self.spare_argv is not None and self._env is not None
            forked = await self._fork()
            if forked is not None:
                if self.closed:
                    await self._discard(forked)
                    return
                forked.watcher = asyncio.create_task(self._watch(forked))
                self._spare = forked
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.spare_argv,
                    env=self._env,
                    cwd=self.cwd,
                    stdin=theirs.fileno(),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL,
                    start_new_session=True,
                    limit=1 << 20,
                )
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            spare = Spare(proc, ours, dict(self._env))
            if self.closed:
                await self._discard(spare)
                return
            spare.watcher = asyncio.create_task(self._watch(spare))
            self._spare = spare
        except Exception as e:  # cannot start one: this attempt and the next are cold
            self._losses += 1
            self._emit("warm_lost", 0, error=f"{type(e).__name__}: {e}")
        finally:
            self._starting = None

    async def _watch(self, spare: Spare) -> None:
        """A spare that dies while waiting is reaped and replaced."""
        code = await spare.process.wait()
        if self._spare is spare:
            self._spare = None
            spare.sock.close()
            self._losses += 1
            self._emit("warm_lost", 0, pid=spare.process.pid, code=code)
            if self._env is not None:
                self.refill(self._env)

    async def take(
        self, epoch: int, env: Mapping[str, str], stderr: IO[Any]
    ) -> zy.DriverProcess | None:
        """Launch the spare as this attempt; None: spawn it cold."""
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._starting)
        spare = self._spare
        if spare is None or spare.process.returncode is not None:
            return None
        if getattr(spare.process, "orphaned", False):
            # Its zygote is gone: it would run with no exit code to tell. Start cold.
            self.zygote = None
            self._spare = None
            self._emit("zygote_off", 0, reason="the zygote of the spare is gone")
            task = asyncio.create_task(self._discard(spare))
            self._discarding.add(task)
            task.add_done_callback(self._discarding.discard)
            return None
        if wl.cold_reason(spare.env, env) is not None:
            return None  # keep the spare for launches it can take
        try:
            wl.send(spare.sock, wl.encode(epoch, self.module_argv, env), stderr.fileno())
        except (OSError, ValueError):
            return None  # dying or gone: its watcher replaces it
        self._spare = None
        if spare.watcher is not None:
            spare.watcher.cancel()
        spare.sock.close()  # the message is queued; the spare reads it, then end of file
        self._losses = 0
        return spare.process

    def give_up(self, why: str) -> None:
        """No more spares for this coordinator: every attempt from now on is cold."""
        self._losses = MAX_LOSSES
        self._emit("warm_off", 0, reason=why)
        spare, self._spare = self._spare, None
        if spare is not None:
            task = asyncio.create_task(self._discard(spare))
            self._discarding.add(task)
            task.add_done_callback(self._discarding.discard)

    async def _discard(self, spare: Spare) -> None:
        spare.sock.close()
        if spare.watcher is not None:
            spare.watcher.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.kill(spare.process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(spare.process.wait(), 10)

    async def close(self) -> None:
        """Kill and reap the spare (and one being started)."""
        self.closed = True
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._starting)
        spare, self._spare = self._spare, None
        if spare is not None:
            await self._discard(spare)
        if self._discarding:
            await asyncio.gather(*self._discarding, return_exceptions=True)
