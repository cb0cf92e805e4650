"""One cua-spacesd daemon as a local "machine": start it, find it, kill it whole.

Why a PID namespace: the daemon's commands are its children, and outside a container
nothing kills them with it (a command outlived its SIGKILLed daemon and kept writing,
see shared/cua-spacesd.md). Run as pid 1 of its own namespace (``unshare --pid --fork
--kill-child --mount-proc``), the daemon takes every process of the Space with it when it
dies, which is what "restart the machine" must mean. ``--kill-child`` also ties the
daemon to the ``unshare`` process, so killing either ends the namespace.

Where ``unshare`` is refused (no CAP_SYS_ADMIN), the fallback is a process group
(``start_new_session``): a restart kills the group and the daemon's process tree as seen
at that moment (the daemon gives each command a session of its own, so ``killpg`` alone
would miss them). Weaker: a process that already left the tree (a double fork, a
daemonized server) survives, and so do commands when only the daemon crashes.

The token is a random string kept in a 0600 file that the daemon watches
(``--await-token-file``): never in argv (``ps``), the environment, logs or error
messages. ``rotate_token`` writes a new one; the daemon installs it and refuses the old one
from then on (its open sessions are revoked too), without a restart. Its epoch floor is
the file ``exec-epoch`` in its data dir, which ``set_floor`` rewrites while it is down.

The state file (``state.json``) holds the port, the pids and their start times (so a pid
reused by an unrelated process is never taken for the daemon), the isolation used and the
instance id; any process can find and kill the Space from it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from durable_spaces.backends.spacesd import procs
from durable_spaces.errors import SpaceError, SpaceUnavailableError
from durable_spaces.host.bounded import MAX_VALUE_BYTES, load_object, read_text
from durable_spaces.host.files import fsync_dir
from durable_spaces.host.ports import free_port

log = logging.getLogger(__name__)

#: How often the daemon reads its token file: a rotation takes effect within this.
TOKEN_POLL_MS = 20
_TOKEN_VARS = ("CUA_ENV_TOKEN", "CUA_SPACESD_TOKEN", "CUA_ENV_TOKEN_FILE")

PIDNS = "pidns"
PGROUP = "pgroup"

_unshare_probe: str | bool | None = False  # False: not probed yet; None: works; str: reason


def unshare_reason() -> str | None:
    """Why a PID namespace cannot be used here (None when it can). Probed once."""
    global _unshare_probe
    if _unshare_probe is False:
        exe = shutil.which("unshare")
        if exe is None:
            _unshare_probe = "no unshare binary on PATH"
        else:
            try:
                r = subprocess.run(
                    [exe, "--pid", "--fork", "--kill-child", "--mount-proc", "true"],
                    capture_output=True,
                    timeout=10,
                )
                _unshare_probe = (
                    None
                    if r.returncode == 0
                    else f"unshare --pid failed: {r.stderr.decode(errors='replace').strip()}"
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                _unshare_probe = f"unshare --pid failed: {e}"
        if _unshare_probe is not None:
            log.warning(
                "PID namespaces unavailable (%s): cua-spacesd Spaces fall back to a process "
                "group; a command that leaves the group may survive a restart",
                _unshare_probe,
            )
    return _unshare_probe if isinstance(_unshare_probe, str) else None


@dataclass
class DaemonState:
    """What ``state.json`` holds."""

    port: int
    instance_id: str
    created: float
    isolation: str = PIDNS
    leader_pid: int = 0  # unshare (pidns) or the daemon itself (pgroup)
    leader_start: float = 0.0
    daemon_pid: int = 0  # host pid of the daemon (pid 1 of the namespace)
    daemon_start: float = 0.0
    booted: float = 0.0


class LocalDaemon:
    """The daemon of one Space, as files under ``<state_dir>/<name>``."""

    def __init__(
        self, home: Path, binary: Path, isolation: str = "auto", listen_host: str = "127.0.0.1"
    ) -> None:
        self.home = home
        self.binary = binary
        self.isolation = isolation
        #: Where the daemon listens (loopback unless the Space is reached from other hosts).
        self.listen_host = listen_host
        self._popens: list[subprocess.Popen[bytes]] = []  # ours to reap

    # --- files -------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.home / "state.json"

    @property
    def work(self) -> Path:
        return self.home / "work"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def log_path(self) -> Path:
        return self.home / "daemon.log"

    def exists(self) -> bool:
        return self.state_path.exists()

    def read_state(self) -> DaemonState | None:
        try:
            data = load_object(self.state_path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return DaemonState(**data)
        except TypeError as e:
            raise SpaceError(f"{self.state_path} is not a daemon's state: {e}") from None

    def _write_state(self, st: DaemonState) -> None:
        # A temporary name of its own: two processes may record the same Space at once
        # (a driver and the coordinator's placement), and must not rename each other's.
        tmp = self.state_path.with_name(f".state.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        with open(tmp, "w") as f:
            json.dump(asdict(st), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)
        fsync_dir(self.home)  # the record survives a host crash (campaigns/power.py)

    def token(self) -> str:
        return read_text(self.home / "token", max_bytes=MAX_VALUE_BYTES).strip()

    def _write_token(self) -> str:
        token = secrets.token_urlsafe(32)
        tmp = self.home / f".token.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.home / "token")
        fsync_dir(self.home)
        return token

    def rotate_token(self) -> str:
        """A new token in the file the daemon watches (caller holds the lock); the
        daemon takes it within ``TOKEN_POLL_MS`` and refuses the old one from then on."""
        return self._write_token()

    def floor(self) -> int:
        """The epoch floor the daemon keeps on disk (0 when it never advanced)."""
        try:
            text = read_text(self.data / "exec-epoch", max_bytes=MAX_VALUE_BYTES).strip()
        except FileNotFoundError:
            return 0
        if not text.isdigit() or len(text) > 19:
            raise SpaceError(f"{self.data / 'exec-epoch'} holds {text[:40]!r}, not an epoch")
        return int(text)

    def set_floor(self, epoch: int) -> None:
        """Rewrite the floor while the daemon is down (caller holds the lock)."""
        tmp = self.data / f".exec-epoch.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(str(epoch))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.data / "exec-epoch")
        fsync_dir(self.data)

    def acquire(self) -> int:
        """Take the Space's lock file (blocking): create/start/kill/delete are serialized
        across processes. Returns the fd; closing it releases the lock."""
        self.home.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.home.parent / f".{self.home.name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        fd = self.acquire()
        try:
            yield
        finally:
            os.close(fd)

    def init(self) -> DaemonState:
        """Lay out a new Space (caller holds the lock and checked it does not exist)."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(exist_ok=True)
        self.data.mkdir(exist_ok=True)
        self._write_token()
        st = DaemonState(
            port=free_port(self.listen_host), instance_id=secrets.token_hex(8), created=time.time()
        )
        self._write_state(st)  # and the home dir's entries with it
        fsync_dir(self.home.parent)
        return st

    # --- process -----------------------------------------------------------------------

    def running(self, st: DaemonState | None = None) -> bool:
        st = st or self.read_state()
        return st is not None and procs.alive(st.daemon_pid, st.daemon_start)

    def boot_id(self) -> str | None:
        """Identity of the running daemon (changes on every start); None when it is down."""
        st = self.read_state()
        if st is None or not procs.alive(st.daemon_pid, st.daemon_start):
            return None
        return f"{st.daemon_pid}:{st.daemon_start}"

    def _mode(self) -> str:
        if self.isolation == PGROUP:
            return PGROUP
        reason = unshare_reason()
        if reason is None:
            return PIDNS
        if self.isolation == PIDNS:
            raise SpaceError(f"a PID namespace was required but is unavailable: {reason}")
        return PGROUP

    def start(self, st: DaemonState) -> DaemonState:
        """Start the daemon on the Space's data dir and port (caller holds the lock).
        Returns once the process exists; the caller waits for its first answer."""
        self._reap()
        self._kill_strays()
        mode = self._mode()
        serve = [
            str(self.binary),
            "serve",
            "--listen",
            f"{self.listen_host}:{st.port}",
            "--data-dir",
            str(self.data),
            "--no-desktop",
            "--no-driver",
            "--quic-port",
            "0",
        ]
        serve += ["--await-token-file", "--token-file", str(self.home / "token")]
        serve += ["--token-poll-ms", str(TOKEN_POLL_MS)]
        argv = serve
        if mode == PIDNS:
            argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *serve]
        # The file is the only token the daemon takes in this mode (it refuses to start
        # beside one in its environment).
        env = {k: v for k, v in os.environ.items() if k not in _TOKEN_VARS}
        with open(self.log_path, "ab") as logf:
            p = subprocess.Popen(
                argv,
                env=env,
                cwd=self.data,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self._popens.append(p)
        st.isolation = mode
        st.leader_pid = p.pid
        st.leader_start = procs.start_time(p.pid) or 0.0
        st.daemon_pid = p.pid
        if mode == PIDNS:
            st.daemon_pid = self._wait_child(p)
        st.daemon_start = procs.start_time(st.daemon_pid) or 0.0
        st.booted = time.time()
        self._write_state(st)
        return st

    def _kill_strays(self) -> None:
        """Kill any daemon still serving this data dir that the state file does not know
        (a driver killed between starting it and recording it): two daemons on one
        ledger would break it."""
        data = str(self.data)
        strays = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "serve" in cmd and data in cmd and p.pid != os.getpid():
                strays.append(p.pid)
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if strays:
            log.warning("killed %d stray cua-spacesd process(es) of %s", len(strays), data)
            self._wait_dead(strays)

    def _wait_child(self, p: subprocess.Popen[bytes]) -> int:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with contextlib.suppress(psutil.NoSuchProcess):
                kids = psutil.Process(p.pid).children()
                if kids:
                    return int(kids[0].pid)
            if p.poll() is not None:
                break
            time.sleep(0.002)
        raise SpaceUnavailableError(f"cua-spacesd did not start: {self.log_tail()}")

    def exited(self, st: DaemonState) -> bool:
        """The daemon we started has already died (e.g. it could not bind its port)."""
        return not procs.alive(st.daemon_pid, st.daemon_start)

    def log_tail(self, n: int = 600) -> str:
        try:
            text = self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return "(no log)"
        with contextlib.suppress(OSError):
            text = text.replace(self.token(), "***")
        return text.strip()

    def kill(self, st: DaemonState | None = None, *, daemon_only: bool = False) -> None:
        """SIGKILL the Space's machine and check that every process of it is gone.

        ``daemon_only``: kill only the daemon process (a crash). In a PID namespace the
        daemon is pid 1, so the kernel kills every process in it too; in a process group
        the daemon's commands survive, as they would after a real crash.
        """
        st = st or self.read_state()
        if st is None:
            return
        members: list[int] = []
        daemon_up = procs.alive(st.daemon_pid, st.daemon_start)
        if st.isolation == PIDNS:
            ns = procs.pid_ns(st.daemon_pid) if daemon_up else None
            if ns is not None and ns != procs.pid_ns(os.getpid()):
                members = procs.ns_members(ns)
            if daemon_up:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(st.daemon_pid, signal.SIGKILL)
            if not daemon_only and procs.alive(st.leader_pid, st.leader_start):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(st.leader_pid, signal.SIGKILL)
        else:
            if daemon_only:
                if daemon_up:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(st.daemon_pid, signal.SIGKILL)
                members = [st.daemon_pid] if daemon_up else []
            else:
                # The daemon puts each command in a session of its own, so killpg alone
                # misses them: kill the daemon's whole process tree as seen right now.
                members = procs.tree(st.daemon_pid) if daemon_up else []
                if procs.alive(st.leader_pid, st.leader_start):  # else the pgid may be reused
                    members += procs.pgroup_members(st.leader_pid)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(st.leader_pid, signal.SIGKILL)
                for pid in members:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
        members.append(st.daemon_pid)
        self._wait_dead(members)

    def members(self, st: DaemonState | None = None) -> list[int]:
        """Every process of the Space's machine right now (its namespace, or the daemon's
        tree and process group in the fallback)."""
        st = st or self.read_state()
        if st is None or not procs.alive(st.daemon_pid, st.daemon_start):
            return []
        if st.isolation == PIDNS:
            ns = procs.pid_ns(st.daemon_pid)
            return (
                procs.ns_members(ns) if ns is not None and ns != procs.pid_ns(os.getpid()) else []
            )
        out = procs.tree(st.daemon_pid)
        if procs.alive(st.leader_pid, st.leader_start):
            out += procs.pgroup_members(st.leader_pid)
        return sorted(set(out))

    def signal_all(self, sig: int, st: DaemonState | None = None) -> list[int]:
        """Send ``sig`` to every process of the machine (a freeze: SIGSTOP / SIGCONT)."""
        pids = self.members(st)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return pids

    def _wait_dead(self, members: list[int]) -> None:
        starts = {pid: procs.start_time(pid) for pid in members if pid > 0}
        deadline = time.monotonic() + 10
        while True:
            self._reap()
            left = [
                pid for pid, t in starts.items() if t is not None and procs.start_time(pid) == t
            ]
            if not left:
                return
            if time.monotonic() > deadline:
                raise SpaceError(f"processes of the Space survived SIGKILL: {left}")
            time.sleep(0.005)

    def _reap(self) -> None:
        self._popens = [p for p in self._popens if p.poll() is None]

    def remove(self) -> None:
        # The lock file stays: unlinking it would let a waiter and a newcomer hold two
        # different locks at once.
        shutil.rmtree(self.home, ignore_errors=True)
