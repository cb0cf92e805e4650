"""A spare forked by the zygote (``drive/warm_zygote.py``), and the runner's zygote.

``fork_spare`` asks the zygote at ``DS_ZYGOTE_SOCKET`` for a spare and returns it as a
``ForkedProcess``: the supervisor reads its stdout, waits for it and kills it by pid
exactly as it does a process it spawned (``DriverProcess`` is what both are). Its exit
code comes from the zygote, its parent. When none comes within ``RELAY_S`` of the spare's
end (its pidfd says when: a zygote stopped or killed must not leave a dead driver looking
alive), or the zygote is gone and then the spare ends, the code is ``UNKNOWN_EXIT``
(255), which a coordinator treats as a crash (the next driver finds the session as it
is). A zygote that refuses, is not there, or does not
answer within ``ANSWER_S`` raises ``ZygoteUnavailable``: the spare is then started the
old way (``drive/spares.py``).

``CampaignZygote`` is the runner's: one zygote per campaign, started with the spare
environment its coordinators will ask for, its socket named to the workers by
``DS_ZYGOTE_SOCKET`` (``Settings.zygote_socket``). The lab's ``DS_ZYGOTE=0``
(``LabSettings.zygote``) turns it off (every spare a new interpreter).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from durable_spaces.drive import warm_launch as wl
from durable_spaces.drive import warm_zygote as wz
from durable_spaces.host.bounded import parse_json

#: The variable naming the zygote's socket to the processes it serves (written here, in
#: the environment ``serving`` is given; read as ``Settings.zygote_socket``).
SOCKET_ENV = "DS_ZYGOTE_SOCKET"
UNKNOWN_EXIT = 255
#: How long after the spare's end its code may take to come from the zygote.
RELAY_S = 1.0
#: The zygote answers a request at once after its imports; waiting longer than this
#: for one that hangs (stopped, say) would delay the resume that takes the spare.
ANSWER_S = 2.0


class ZygoteUnavailable(Exception):
    """No spare from the zygote: start one the old way."""


class DriverProcess(Protocol):
    """What a supervisor needs of a driver: a spawned one or one the zygote forked."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    stdout: asyncio.StreamReader | None

    async def wait(self) -> int: ...


class ForkedProcess:
    """A spare the zygote forked: pid, stdout, and the exit code the zygote relays."""

    def __init__(
        self, pid: int, stdout: asyncio.StreamReader | None, relay: socket.socket, zygote: int
    ) -> None:
        self.pid = pid
        self.stdout: asyncio.StreamReader | None = stdout
        self.zygote = zygote
        self._code: int | None = None
        self._orphaned = False
        self._pidfd: int | None = None
        with contextlib.suppress(OSError):  # now, while it cannot have been reaped
            self._pidfd = os.pidfd_open(pid)
        self._ended = asyncio.get_running_loop().create_task(self._follow(relay))

    @property
    def returncode(self) -> int | None:
        return self._code

    @property
    def orphaned(self) -> bool:
        """The zygote went before this spare ended: its exit code will not be known. A
        spare not yet launched still holds its end of the relay, so the relay's end of
        file comes only after its launch; its parent tells sooner."""
        if self._orphaned:
            return True
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False  # it ended: its code (or the relay's end) is on its way
        fields = stat[stat.rfind(b")") + 2 :].split()
        return len(fields) > 1 and int(fields[1]) != self.zygote

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    async def _follow(self, relay: socket.socket) -> int:
        """The exit code the zygote relays; ``UNKNOWN_EXIT`` when the spare ended (its
        pidfd says so) and no code came within ``RELAY_S`` (a zygote stopped or gone
        must not leave a dead driver looking alive), or the zygote is gone and then the
        spare ended."""
        loop = asyncio.get_running_loop()
        relayed = asyncio.ensure_future(self._relayed(relay))
        ended = self._ended_fd()
        waiters: set[asyncio.Future[Any]] = {relayed, ended}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if not relayed.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(relayed), RELAY_S)
            code = relayed.result() if relayed.done() else None
            if code is None:
                self._orphaned = True
                if self._pidfd is not None:  # without one (pidfd_open failed): at once
                    await ended
                code = UNKNOWN_EXIT
            self._code = code
            return code
        finally:
            for t in (relayed, ended):
                t.cancel()
            relay.close()
            if self._pidfd is not None:
                loop.remove_reader(self._pidfd)
            self.close()

    async def _relayed(self, relay: socket.socket) -> int | None:
        """The code from the zygote; None at its end of file (it is gone)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await loop.sock_recv(relay, 4096)
            except OSError:
                return None
            if not data:
                return None
            code = _exit_of(data)
            if code is not None:
                return code

    def _ended_fd(self) -> asyncio.Future[None]:
        """Done when the spare has ended (its pidfd turns readable); never without one."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not ended.done():
                ended.set_result(None)

        if self._pidfd is not None:
            loop.add_reader(self._pidfd, readable)
        return ended

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def _exit_of(data: bytes) -> int | None:
    try:
        msg = parse_json(data, where="the zygote's exit")
    except ValueError:
        return None
    code = msg.get("exit") if isinstance(msg, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


async def fork_spare(
    address: str,
    argv: Sequence[str],
    state_dir: str | os.PathLike[str],
    cwd: str | Path | None,
    env: Mapping[str, str],
    *,
    limit: int = 1 << 20,
    mode: str = "spare",
    stdout: int | None = None,
) -> tuple[ForkedProcess, socket.socket]:
    """A spare of ``<python> -m <argv>`` from the zygote at ``address``: its process
    and its launch socket (for ``drive.warm_launch.send``, or a worker's line). Its stdout is
    a pipe the process reads, or the descriptor ``stdout`` (then not read)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.setblocking(False)
    r = w = -1
    try:
        await asyncio.wait_for(loop.sock_connect(sock, address), ANSWER_S)
        if stdout is None:
            r, w = os.pipe2(os.O_CLOEXEC)
        where = os.path.abspath(cwd or os.getcwd())
        data = wz.encode(mode, list(argv), os.fspath(state_dir), where, dict(env))
        wl.send(sock, data, w if stdout is None else stdout)
        if w >= 0:
            os.close(w)
            w = -1
        answer = await asyncio.wait_for(loop.sock_recv(sock, 65536), ANSWER_S)
        msg = parse_json(answer, where="the zygote's answer") if answer else {}
        pid = msg.get("pid") if isinstance(msg, dict) else None
        zygote = msg.get("zygote") if isinstance(msg, dict) else None
        if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (pid, zygote)):
            why = msg.get("refused") if isinstance(msg, dict) else None
            raise ZygoteUnavailable(f"the zygote did not fork a spare: {why or answer[:200]!r}")
        reader = None
        if r >= 0:
            reader = asyncio.StreamReader(limit=limit)
            pipe = os.fdopen(r, "rb", 0)
            r = -1
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        launch = sock.dup()
        assert isinstance(pid, int) and isinstance(zygote, int)
        return ForkedProcess(pid, reader, sock, zygote), launch
    except (TimeoutError, OSError, ValueError) as e:
        sock.close()
        raise ZygoteUnavailable(f"{type(e).__name__}: {e}") from None
    except BaseException:
        sock.close()
        raise
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)


class CampaignZygote:
    """The runner's zygote: started with ``env`` (the spare environment its workers'
    coordinators compute) plus ``DS_ZYGOTE_SOCKET`` (its address, which the workers'
    environment names too), preloading ``modules``; ``close()`` ends it."""

    def __init__(self, env: Mapping[str, str], modules: Sequence[str]) -> None:
        self._dir = tempfile.mkdtemp(prefix="ds-zygote-")  # short: a socket path < 108
        self.address = os.path.join(self._dir, "s")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(self.address)
            listener.listen(64)
            fd = listener.fileno()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "durable_spaces.drive.warm_zygote", str(fd), *modules],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**env, SOCKET_ENV: self.address}, start_new_session=True, pass_fds=(fd,),
            )  # fmt: skip
        finally:
            listener.close()

    def close(self) -> None:
        """End of file on its stdin (it exits), then kill and reap it."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.address)
            os.rmdir(self._dir)


@contextlib.contextmanager
def serving(
    env: MutableMapping[str, str], run_one_module: str, on: bool = True
) -> Iterator[CampaignZygote | None]:
    """A zygote while inside, named in ``env`` (the environment the coordinators and
    their drivers get: a runner's workers', or ``os.environ`` for a run in this process),
    preloading the ``DRIVER_MODULES`` of ``run_one_module``, that module and the
    campaign's worker (a spare worker is forked there too). Its own environment is the
    spares' a coordinator computes from ``env`` (``Coordinator._driver_env`` less what is
    read at run time). Off unless ``on`` (the caller's settings: ``DS_ZYGOTE`` and
    ``DS_WARM_DRIVERS``): then it yields None."""
    if not on:
        yield None
        return
    drivers = getattr(importlib.import_module(run_one_module), "DRIVER_MODULES", ())
    # The drivers' modules, and the spare workers' (campaigns/worker_spares.py).
    modules = [*drivers, run_one_module, "durable_spaces.campaigns.worker"]
    z = CampaignZygote({**wl.spare_env(env), "PYTHONUNBUFFERED": "1"}, modules)
    env[SOCKET_ENV] = z.address
    try:
        yield z
    finally:
        env.pop(SOCKET_ENV, None)
        z.close()
