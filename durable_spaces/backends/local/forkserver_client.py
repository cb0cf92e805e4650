"""How a driver gets a command's supervisor from its Space's fork server (``forkserver.py``):
find the server and check it is this Space's and this code's, start it when it is not
there, and ask it for a child. Everything here runs under the Space's lock (``local_space.py``'s
spawn), so two drivers never race to start a server, and no caller is ever between its
look at the server and its request when an idle server retires.

Any failure (no server can start, it does not answer, it answers nonsense) answers None,
and the caller starts the supervisor directly (``python -I -S supervisor.py``), as before
the server existed; a server that failed to start is not tried again for ``RETRY_AFTER``
seconds by this Space handle. ``Settings.local_forkserver`` off (``DS_LOCAL_FORKSERVER=0``)
turns the server off.

A server is trusted only when ``forkserver.json`` names this Space's instance, this
code's version (a hash of the server's and the supervisor's sources and the interpreter)
and the cgroup it fences commands in (``forkserver.py``: whom it serves)
and the socket's listener (SO_PEERCRED) is the recorded pid under our uid: a stale file
from a dead server, whose pid may be someone else's now, is refused by the connect, and
a mismatched live server is killed only while its pid, create time and ``MARK`` say it is
the recorded one (never its children: they are running commands).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from durable_spaces.backends.local.disk import read_json, write_atomic
from durable_spaces.backends.local.forkserver import LOG, MARK, META, SOCK, peer, request
from durable_spaces.backends.local.procs import alive, dead, track
from durable_spaces.chaos.failpoints import hit
from durable_spaces.host.proc_start import started
from durable_spaces.settings import DEFAULTS, Settings

START_TIMEOUT = 10.0
REPLY_TIMEOUT = 5.0
RETRY_AFTER = 10.0

_HERE = Path(__file__).parent
_SERVER = str(_HERE / "forkserver.py")
_version: str | None = None


def version() -> str:
    """This code's server: what a running server must have been started as."""
    global _version
    if _version is None:
        h = hashlib.sha256(sys.executable.encode())
        sources = ("forkserver.py", "supervisor.py", "confine.py", "../../chaos/failpoints.py")
        for f in sources:
            h.update((_HERE / f).read_bytes())
        _version = h.hexdigest()[:16]
    return _version


@dataclass
class Forked:
    """A supervisor the server forked for us: it waits for the spec on ``conn``."""

    pid: int
    ctime: float
    conn: socket.socket

    def send(self, spec: bytes) -> None:
        """Hand over the command (a child killed meanwhile reads ``lost``, as a direct
        supervisor whose pipe broke)."""
        with contextlib.suppress(OSError):
            self.conn.sendall(spec)
            self.conn.shutdown(socket.SHUT_WR)
        self.conn.close()


class ForkServer:
    """The fork server of the Space in directory ``d`` (instance ``instance``)."""

    def __init__(
        self, d: Path, instance: str, settings: Settings = DEFAULTS, cgroup: str = ""
    ) -> None:
        """``cgroup``: the Space's cgroup as ``/proc/self/cgroup`` names it when its
        commands are fenced in their epochs (``cgroups.SpaceCgroups.fenced``), else "":
        the server then serves only callers outside it, children it placed in an epoch."""
        self._d = d
        self._instance = instance
        self._cgroup = cgroup
        self._retry_at = 0.0
        self._settings = settings

    def fork(self, cmd_dir: Path) -> Forked | None:
        """A supervisor for ``cmd_dir``, or None (start one directly). Under the lock."""
        if not self._settings.local_forkserver or time.monotonic() < self._retry_at:
            return None
        for _ in range(2):  # the recorded server, else (or when it fails) a fresh one
            meta = self._current()
            if meta is None:
                meta = self._start()
                if meta is None:
                    break
            forked = self._ask(meta, cmd_dir)
            if forked is not None:
                return forked
            stop(self._d, meta)
        self._retry_at = time.monotonic() + RETRY_AFTER
        return None

    def _current(self) -> dict[str, Any] | None:
        """The recorded server if it is this Space's and this code's (a mismatched one is
        stopped)."""
        try:
            meta = read_json(self._d / META)
        except OSError:
            return None
        if not isinstance(meta, dict):
            return None
        if (
            meta.get("instance") != self._instance
            or meta.get("version") != version()
            or meta.get("cgroup", "") != self._cgroup
        ):
            stop(self._d, meta)
            return None
        return meta

    def _ask(self, meta: dict[str, Any], cmd_dir: Path) -> Forked | None:
        dirfd = os.open(self._d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(REPLY_TIMEOUT)
            s.connect(f"/proc/self/fd/{dirfd}/{SOCK}")
            if peer(s) != (meta["pid"], os.getuid()):
                s.close()
                return None  # someone else's socket, or another server's
            s.sendall(request(str(cmd_dir)))
            reply = b""
            while not reply.endswith(b"\n") and len(reply) < 32:
                chunk = s.recv(32)
                if not chunk:
                    break
                reply += chunk
            pid = int(reply) if reply.endswith(b"\n") else 0
            if pid <= 0:
                s.close()
                return None
            ctime = started(pid)
            s.settimeout(None)
        except (OSError, ValueError, psutil.Error):
            s.close()  # a child that exists reads EOF: it never runs anything
            return None
        finally:
            os.close(dirfd)
        hit("space.local.forked")  # dying here: the child reads EOF, the key reads lost
        return Forked(pid, ctime, s)

    def _start(self) -> dict[str, Any] | None:
        """Start this Space's server and record it; None when it does not come up."""
        try:
            for name in (SOCK, META):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._d / name)
        except OSError:
            return None  # not a file we can replace (a directory, say): no server here
        env = {MARK: self._instance, "PATH": os.environ.get("PATH", os.defpath)}
        if "LD_LIBRARY_PATH" in os.environ:  # an interpreter that needs it to start
            env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
        armed = self._settings.local_forkserver_failpoints
        if armed is not None:  # the server's own failpoints (tests)
            env["DS_FAILPOINTS"] = armed
        idle = str(self._settings.local_forkserver_idle)
        argv = [sys.executable, "-I", "-S", _SERVER, str(self._d), self._instance, version(), idle]
        argv.append("failpoints" if armed else "")  # whether to load them (``forkserver.py``)
        argv.append(self._cgroup)
        try:
            with open(self._d / LOG, "ab") as log:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    cwd=self._d,
                    env=env,
                    start_new_session=True,
                )
        except OSError:
            return None
        track(popen)
        assert popen.stdout is not None
        ready, _, _ = select.select([popen.stdout], [], [], START_TIMEOUT)
        line = popen.stdout.readline() if ready else b""
        popen.stdout.close()
        try:
            if line != b"ready\n":
                raise psutil.NoSuchProcess(popen.pid)
            ctime = started(popen.pid)
        except psutil.Error:
            popen.kill()
            return None
        meta = {
            "pid": popen.pid,
            "ctime": ctime,
            "instance": self._instance,
            "version": version(),
            "cgroup": self._cgroup,
        }
        write_atomic(self._d / META, json.dumps(meta).encode(), fsync=False)
        hit("space.local.server_started")  # dying here: the next driver uses this server
        return meta


def stop(d: Path, meta: dict[str, Any]) -> None:
    """SIGKILL the server ``meta`` records while its pid, create time and mark say it is
    that server, and remove its files."""
    try:
        pid, ctime, instance = int(meta["pid"]), float(meta["ctime"]), str(meta["instance"])
    except (KeyError, TypeError, ValueError):
        pid, ctime, instance = 0, 0.0, ""
    if pid > 0 and alive(pid, ctime):
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.environ().get(MARK) == instance:
                p.kill()
                deadline = time.monotonic() + 5
                while not dead(p) and time.monotonic() < deadline:
                    time.sleep(0.002)
    for name in (SOCK, META):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            os.unlink(d / name)
