"""Backend ``spacesd``: the real cua-spacesd binary from the ``cua`` wheel, on this host.

A Space is one daemon process on a fixed loopback port with its own data dir (its exec
ledger and epoch floor), a workspace directory (``Space.root``, an absolute host path) and
a random token, running as pid 1 of its own PID namespace so that restarting the Space's
machine kills every command in it (``spacesd_daemon`` explains why and the fallback).
Everything else goes through the daemon's API (``spacesd_space``).

Properties a caller can rely on:

- ``restart``: SIGKILL of the whole namespace (checked: no process of it survives), then
  a new daemon on the same data dir and port. Running commands read back ``LOST`` and
  stop writing; files, finished records and the epoch floor survive.
- ``kill_daemon``: SIGKILL of the daemon process alone, as a crash. Because the daemon is
  pid 1 of the namespace, the kernel kills every command with it: here it has the same
  effect as ``restart``. In the process-group fallback, commands survive their daemon
  (and keep writing), as with the bare daemon.
- ``find`` after a driver restart reconnects to the daemon from the state file; if the
  daemon is not running (the host rebooted), it is started again on the same data dir,
  the way a machine boots.
- ``scan`` runs on this host, kept by a change journal (``local.journal``: the workspace
  is a directory here) for as long as the journal is trusted; it trusts nothing across
  a new start of the daemon, and leaves scanning to the daemon when its mount namespace
  could show the workspace otherwise (a mount inside it) or the journal is off.
  ``read_files`` answers from the bytes that scan read, the rest through one ``tar``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from durable_spaces.backends.spacesd.daemon import (
    PIDNS,
    TOKEN_POLL_MS,
    DaemonState,
    LocalDaemon,
    unshare_reason,
)
from durable_spaces.backends.spacesd.namespaced_space import NamespacedSpace, _Probe
from durable_spaces.backends.spacesd.runtime import start_runtime
from durable_spaces.backends.spacesd.spacesd_space import SpacesdSpace
from durable_spaces.errors import (
    BackendUnavailableError,
    ConfigError,
    SpaceGoneError,
    SpaceUnavailableError,
)
from durable_spaces.host.ports import free_port
from durable_spaces.settings import Settings

__all__ = [
    "NamespacedSpace",
    "SpacesdBackend",
    "daemon_binary",
    "unavailable_reason",
    "unshare_reason",
]

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_SDK_HOME = ".cua-sdk"
_unavailable: str | bool | None = False
_checking = threading.Lock()


def daemon_binary() -> Path:
    """The static daemon shipped inside the ``cua`` wheel."""
    import cua

    return Path(cua.__file__).parent / "bin" / "cua-spacesd-linux-x86_64"


def _missing_reason() -> str | None:
    """Why there is no daemon binary to run (no ``cua``, no file), or None: the cheap
    half of ``unavailable_reason``."""
    try:
        exe = daemon_binary()
    except ImportError as e:
        return f"the cua package is not installed: {e}"
    return None if exe.exists() else f"no cua-spacesd binary at {exe}"


def unavailable_reason() -> str | None:
    """None when the daemon binary exists and runs here; otherwise why not (cached).
    Thread-safe: a caller during another's run (``warm_up`` runs it in a thread) waits
    for its answer, never sees one half made."""
    global _unavailable
    with _checking:
        if _unavailable is False:
            reason = _missing_reason()
            if reason is None:
                exe = daemon_binary()
                try:
                    r = subprocess.run([str(exe), "--version"], capture_output=True, timeout=20)
                    if r.returncode != 0:
                        reason = f"{exe.name} --version exited {r.returncode}"
                except (OSError, subprocess.TimeoutExpired) as e:
                    reason = f"{exe.name} does not run here: {e}"
            _unavailable = reason
    return _unavailable if isinstance(_unavailable, str) else None


class SpacesdBackend:
    """Named cua-spacesd Spaces under ``state_dir``, one local daemon each.

    Options: ``isolation`` ("auto": a PID namespace where ``unshare`` works, else a
    process group; "pidns" to require it; "pgroup"), ``binary`` (another daemon build),
    ``start_timeout`` (seconds to wait for a daemon's first answer), ``listen_host``
    (the address daemons listen on: loopback by default; a host's own address when
    drivers on other hosts reach its Spaces, as ``durable_spaces/cluster/host.py`` does).
    """

    kind = "spacesd"

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        isolation: str = "auto",
        binary: str | os.PathLike[str] | None = None,
        start_timeout: float = 20.0,
        listen_host: str = "127.0.0.1",
        settings: Settings | None = None,
    ) -> None:
        if isolation not in ("auto", "pidns", "pgroup"):
            raise ValueError(f"isolation must be auto, pidns or pgroup, not {isolation!r}")
        # Only the cheap check here: a driver that reconnects to a running daemon never
        # runs the binary, so its ``--version`` run waits for ``_boot``.
        reason = _missing_reason() if binary is None else None
        if reason is not None:
            raise BackendUnavailableError(reason)
        self._checked = binary is not None
        self.settings = Settings.from_env() if settings is None else settings
        self.state_dir = Path(state_dir).absolute()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.binary = Path(binary) if binary is not None else daemon_binary()
        self.isolation = isolation
        self.start_timeout = start_timeout
        self.listen_host = _check_listen_host(listen_host)
        self._daemons: dict[str, LocalDaemon] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._spaces: dict[str, NamespacedSpace] = {}
        #: Seconds from process start to the daemon's first answer, last start.
        self.last_boot_seconds: float | None = None

    @staticmethod
    def warm_up(state_dir: str | os.PathLike[str]) -> None:
        """For a driver started before its launch (``drive/warm_driver.py``): check the
        binary and start the SDK runtime of this state dir now, not on the first call.
        Opens no Space and creates nothing. The runtime does no I/O until its first call,
        so it starts even when the state dir is not made yet: the spare of a session's
        first resume is started as its first driver launches, before that driver made
        the dir, and that resume paid the runtime's start on its way.
        The binary's run (``unavailable_reason``; more CPU when the binary is not in the
        page cache) goes on in a thread: only booting a daemon
        needs it (``_boot`` runs it if it is not done), and a spare is ready that much
        sooner for a driver that dies soon after its launch."""
        if _missing_reason() is None:
            start_runtime(str(Path(state_dir).absolute() / _SDK_HOME))
            threading.Thread(target=unavailable_reason, name="spacesd-check", daemon=True).start()

    def _sdk_home(self) -> str:
        """The cua SDK's state for this backend (its sandbox registry), not ~/.cua."""
        home = self.state_dir / _SDK_HOME
        home.mkdir(mode=0o700, exist_ok=True)
        return str(home)

    def _daemon(self, name: str) -> LocalDaemon:
        if not _NAME.match(name):
            raise ValueError(f"bad Space name {name!r}: [a-z0-9._-], at most 63, not leading '.'")
        d = self._daemons.get(name)
        if d is None:
            d = LocalDaemon(self.state_dir / name, self.binary, self.isolation, self.listen_host)
            self._daemons[name] = d
        return d

    @contextlib.asynccontextmanager
    async def _locked(self, d: LocalDaemon) -> AsyncIterator[None]:
        """The Space's lock: an asyncio lock within this process (a blocking flock taken
        twice in one event loop would deadlock it), then the lock file, taken off-loop."""
        lock = self._locks.setdefault(d.home.name, asyncio.Lock())
        async with lock:
            taking = asyncio.ensure_future(asyncio.to_thread(d.acquire))
            try:
                fd = await asyncio.shield(taking)
            except asyncio.CancelledError:  # release it once the thread has it
                taking.add_done_callback(_close_fd)
                raise
            try:
                yield
            finally:
                os.close(fd)

    # --- starting ----------------------------------------------------------------------

    async def _boot(self, d: LocalDaemon, st: DaemonState) -> DaemonState:
        """Start the daemon and wait for its first answer (caller holds the lock).
        A port taken meanwhile by someone else gets a new one, recorded in the state."""
        from durable_spaces.backends.spacesd.runtime import check_exec_ledger

        if not self._checked:
            reason = await asyncio.to_thread(unavailable_reason)
            if reason is not None:
                raise BackendUnavailableError(reason)
            self._checked = True
        for attempt in range(3):
            t0 = time.monotonic()
            st = await asyncio.to_thread(d.start, st)
            probe = _Probe(d, st.instance_id)
            space = SpacesdSpace(
                d.home.name,
                str(d.work),
                st.instance_id,
                self._url(st),
                d.token(),
                probe,
                sdk_home=self._sdk_home(),
            )
            deadline = t0 + self.start_timeout
            caps = None
            while caps is None:
                try:
                    caps = await space._call("capabilities")
                except SpaceUnavailableError:
                    if d.exited(st) or time.monotonic() > deadline:
                        break
                    space.disconnect()
                    await asyncio.sleep(0.01)
            if caps is None:
                tail = d.log_tail()
                await asyncio.to_thread(d.kill, st)
                if "in use" in tail.lower() and attempt < 2:
                    st.port = free_port(self.listen_host)
                    continue
                raise SpaceUnavailableError(
                    f"cua-spacesd for Space {d.home.name!r} did not answer: {tail}"
                )
            self.last_boot_seconds = time.monotonic() - t0
            try:
                check_exec_ledger(caps)
            except Exception:
                await asyncio.to_thread(d.kill, st)
                raise
            return st
        raise SpaceUnavailableError(f"cua-spacesd for Space {d.home.name!r} could not start")

    def _space(self, d: LocalDaemon, st: DaemonState) -> NamespacedSpace:
        name = d.home.name
        sp = self._spaces.get(name)
        if sp is not None and sp.instance_id == st.instance_id and sp._url == self._url(st):
            sp.daemon_pid = st.daemon_pid if st.isolation == PIDNS else 0  # a restart's
            return sp
        sp = NamespacedSpace(
            name,
            str(d.work),
            st.instance_id,
            self._url(st),
            d.token(),
            _Probe(d, st.instance_id),
            sdk_home=self._sdk_home(),
            settings=self.settings,
        )
        sp.daemon_pid = st.daemon_pid if st.isolation == PIDNS else 0
        self._spaces[name] = sp
        return sp

    async def _ensure(self, d: LocalDaemon, *, create: bool) -> NamespacedSpace | None:
        async with self._locked(d):
            st = d.read_state()
            if st is None:
                if not create:
                    return None
                st = d.init()
                st = await self._boot(d, st)
            elif not d.running(st):
                await asyncio.to_thread(d.kill, st)  # leftovers of a half-dead namespace
                st = await self._boot(d, st)
            return self._space(d, st)

    # --- SpaceBackend ------------------------------------------------------------------

    async def create(self, name: str) -> NamespacedSpace:
        space = await self._ensure(self._daemon(name), create=True)
        assert space is not None  # create=True always places one
        return space

    async def find(self, name: str) -> NamespacedSpace | None:
        return await self._ensure(self._daemon(name), create=False)

    async def restart(self, name: str) -> None:
        d = self._daemon(name)
        async with self._locked(d):
            st = d.read_state()
            if st is None:
                raise SpaceGoneError(f"no Space {name!r} to restart")
            await asyncio.to_thread(d.kill, st)
            await self._boot(d, st)

    async def rotate_token(self, name: str, max_epoch: int | None = None) -> str:
        """A new access token for the Space's daemon, returned once the daemon refuses the
        old one (``LocalDaemon.rotate_token``). ``max_epoch``: when the daemon's floor is
        above it, the floor was raised past what its holder was granted; the machine is
        restarted on a floor of ``max_epoch`` (every process of it dies, as an epoch
        advance would have killed them).

        The floor is looked at only once the old token is refused: until the daemon takes
        the new token (within ``TOKEN_POLL_MS``), the superseded holder can still raise it,
        and a look before the switch would hand the new holder a wedged Space."""
        d = self._daemon(name)
        async with self._locked(d):
            st = d.read_state()
            if st is None:
                raise SpaceGoneError(f"no Space {name!r}")
            self._spaces.pop(name, None)  # it holds the old token
            token = await asyncio.to_thread(d.rotate_token)
            floor = await self._switched(d, st)
            if max_epoch is not None and max(floor, await asyncio.to_thread(d.floor)) > max_epoch:
                self._spaces.pop(name, None)
                await asyncio.to_thread(d.kill, st)
                await asyncio.to_thread(d.set_floor, max_epoch)
                await self._boot(d, st)
            return token

    async def _switched(self, d: LocalDaemon, st: DaemonState) -> int:
        """Wait until the daemon answers the token just written (it then refuses the old
        one; caller holds the lock), restarting it when it is down or does not watch its
        file. Returns the daemon's floor as it answered with the new token (0 after a
        restart: the floor file is all there is then)."""
        if not d.running(st):
            await asyncio.to_thread(d.kill, st)
            await self._boot(d, st)
            return 0
        space = self._space(d, st)
        deadline = time.monotonic() + self.start_timeout
        while True:  # until the daemon answers the new token: the old one is refused
            try:
                resp = await space._rpc("GetExecRecord", {"requestId": "durable-spaces:rotate"})
                return int(resp.get("epoch", 0))
            except SpaceUnavailableError:
                if not d.running(st):
                    raise
                if time.monotonic() > deadline:
                    # A daemon that does not watch its file (started by older code):
                    # a restart reads the new token, and watches from then on.
                    self._spaces.pop(d.home.name, None)
                    await asyncio.to_thread(d.kill, st)
                    await self._boot(d, st)
                    return 0
                space.disconnect()
                await asyncio.sleep(TOKEN_POLL_MS / 1000)

    async def kill_daemon(self, name: str) -> None:
        d = self._daemon(name)
        async with self._locked(d):
            st = d.read_state()
            if st is None:
                raise SpaceGoneError(f"no Space {name!r}")
            await asyncio.to_thread(lambda: d.kill(st, daemon_only=True))
            await self._boot(d, st)

    async def power_off(self, name: str) -> None:
        """SIGKILL of the whole machine, not started again: the host lost power
        (``campaigns/power.py``); the next ``find`` boots it on what its disk kept."""
        d = self._daemon(name)
        async with self._locked(d):
            st = d.read_state()
            if st is not None:
                await asyncio.to_thread(d.kill, st)

    async def pause(self, name: str) -> None:
        """Freeze the Space's machine (SIGSTOP of every process in it, the daemon too):
        requests hang until ``resume``; nothing is lost."""
        d = self._daemon(name)
        async with self._locked(d):
            if d.read_state() is None:
                raise SpaceGoneError(f"no Space {name!r}")
            await asyncio.to_thread(d.signal_all, signal.SIGSTOP)

    async def resume(self, name: str) -> None:
        d = self._daemon(name)
        async with self._locked(d):
            await asyncio.to_thread(d.signal_all, signal.SIGCONT)

    async def delete(self, name: str) -> None:
        d = self._daemon(name)
        async with self._locked(d):
            st = d.read_state()
            if st is not None:
                await asyncio.to_thread(d.kill, st)
            await asyncio.to_thread(d.remove)
        sp = self._spaces.pop(name, None)
        if sp is not None:
            await sp.close()

    def _url(self, st: DaemonState) -> str:
        return f"http://{self.listen_host}:{st.port}"

    async def names(self) -> list[str]:
        return sorted(
            p.name
            for p in self.state_dir.iterdir()
            if _NAME.match(p.name) and (p / "state.json").exists()
        )

    async def close(self) -> None:
        for sp in self._spaces.values():
            with contextlib.suppress(Exception):
                await sp.close()
        self._spaces.clear()


def _close_fd(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        os.close(fut.result())


def _check_listen_host(host: str) -> str:
    """An IPv4 address (or ``localhost``) to bind: it goes into the daemon's argv."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        if host != "localhost":
            raise ConfigError(f"spacesd listen_host {host!r}: give an IPv4 address") from None
    return host


if TYPE_CHECKING:  # what mypy checks this backend against (durable_spaces.space)
    from durable_spaces.space import Faults, Space, SpaceBackend

    def _conforms(b: SpacesdBackend, s: NamespacedSpace) -> tuple[SpaceBackend, Faults, Space]:
        return b, b, s
