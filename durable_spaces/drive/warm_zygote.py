"""The zygote: one process that imports a driver's modules once and forks each spare.

A spare (``drive/warm_driver.py``) started as a new interpreter spends CPU on the
interpreter and its imports before it waits (docs/performance.md); a campaign starts two or three
per run, most of its processes' CPU on a 2-core machine. Forked from a process that has
done the imports, a spare costs a fork. ::

    <python> -m durable_spaces.drive.warm_zygote <fd> [module ...]

imports the modules named (the drivers' it will fork), with ``<fd>`` a listening
``SOCK_SEQPACKET`` Unix socket and stdin a pipe from its starter
(end of file: the starter is gone, and so is the zygote). It stays single-threaded, so a
fork copies no lock another thread holds. For each connection from its own uid it forks
a child; the connection is the spare's launch socket. The first message on it (the
*request*, from ``drive/zygote.py``) is a JSON object ::

    {"v": 1, "mode": "spare", "argv": [<module>, args...], "state_dir": "...",
     "cwd": "...", "env": {...}}

with one descriptor: the spare's stdout. The child checks it strictly, as a launch is
(``drive/warm_launch.py``); the request's environment may differ from the zygote's only in the
variables read at run time (the imports already read the others: ``cold_reason``), and
its caller must be in the zygote's namespaces (network, mount, PID, ...: ``NAMESPACES``). It
answers ``{"pid": <its pid>, "zygote": <the zygote's>}`` and is from then on what a
spare started by a new interpreter is: its own session, the request's cwd, stdin the
socket, stdout the pipe, stderr ``/dev/null``, the module's ``warm_up``, then its
launch. With ``"mode": "main"`` it is ``<python> -m <module> [args...]`` at once (a
campaign's spare worker, which reads its run on stdin). A request it cannot take is
answered ``{"refused": "<why>"}`` (the caller then
starts a spare the old way).

The zygote reaps its children and sends each one's exit code on its connection
(``{"exit": <code>}``, negative for a signal, as ``returncode``): the caller is not the
spare's parent. A caller that hangs up before its spare ended has no one to supervise
that spare any more: the zygote SIGKILLs it, as the runner's ``_kill_tree`` kills what a
killed worker started. Killed itself, the zygote leaves its children running; their
callers see end of file instead of an exit code (``drive/zygote.py``). When its
stdin ends (the campaign is over, or its runner died) it kills and reaps the children
left, so none outlives the campaign.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from durable_spaces.drive import protocol as sp
from durable_spaces.drive import warm_driver
from durable_spaces.drive import warm_launch as wl
from durable_spaces.errors import ConfigError
from durable_spaces.host.bounded import parse_json

VERSION = 1
_KEYS = {"v", "mode", "argv", "state_dir", "cwd", "env"}
#: ``spare``: a warm driver waiting for its launch; ``main``: ``-m <module> [args]`` at
#: once, stdin the socket (a campaign's spare worker reads its run's line there).
MODES = ("spare", "main")
_HANGUP = select.POLLHUP | select.POLLERR | select.POLLRDHUP | select.POLLNVAL


@dataclass(frozen=True)
class Request:
    mode: str
    argv: list[str]
    state_dir: Path
    cwd: str
    env: dict[str, str]


def encode(mode: str, argv: list[str], state_dir: str, cwd: str, env: dict[str, str]) -> bytes:
    msg = {"v": VERSION, "mode": mode, "argv": argv, "state_dir": state_dir, "cwd": cwd}
    return json.dumps({**msg, "env": env}, separators=(",", ":")).encode()


def decode(data: bytes, started_with: dict[str, str]) -> Request:
    """A request, checked strictly (``ConfigError`` names what is wrong)."""
    try:
        msg = parse_json(data.decode("utf-8"), where="the request")
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"the request is not JSON: {e}") from None
    if not isinstance(msg, dict) or set(msg) != _KEYS:
        raise ConfigError(f"the request must be an object with exactly the keys {sorted(_KEYS)}")
    if msg["v"] != VERSION or isinstance(msg["v"], bool):
        raise ConfigError(f"unknown request version {msg['v']!r}")
    argv, env, cwd = msg["argv"], msg["env"], msg["cwd"]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigError("argv must be a non-empty list of strings")
    wl.check_module(argv[0])
    if not isinstance(env, dict) or len(env) > wl.MAX_VARS:
        raise ConfigError(f"env must be an object of at most {wl.MAX_VARS} variables")
    for k, v in env.items():
        if not isinstance(v, str) or not k or "=" in k or "\x00" in k + v:
            raise ConfigError(f"bad variable {k[:60]!r}")
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or "\x00" in cwd:
        raise ConfigError("cwd must be an absolute path")
    if msg["mode"] not in MODES:
        raise ConfigError(f"mode must be one of {list(MODES)}")
    if not isinstance(msg["state_dir"], str):
        raise ConfigError("state_dir must be a string")
    state_dir = Path(cwd)
    if msg["mode"] == "spare":
        state_dir = sp.check_state_dir("state_dir", msg["state_dir"])
    differs = wl.cold_reason(started_with, env)
    if differs is not None:
        raise ConfigError(f"this zygote cannot fork that spare: {differs}")
    return Request(msg["mode"], list(argv), state_dir, cwd, dict(env))


#: Where a process lives besides its environment: a spare forked in other namespaces
#: than its caller's would run outside them (a driver of a host in its own network
#: namespace would escape that host's partitions, say).
NAMESPACES = ("net", "mnt", "pid", "user", "ipc", "uts", "cgroup")


def other_namespace(conn: socket.socket) -> str | None:
    """Why the process at the other end of ``conn`` is not in this one's namespaces
    (its pid as the kernel gave it at connect, so no word of the caller's is taken), or
    None when it is in all of them."""
    cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    pid = int.from_bytes(cred[:4], sys.byteorder)
    if pid <= 0:
        return "the caller is in a PID namespace this zygote cannot see"
    for ns in NAMESPACES:
        try:
            ours = os.stat(f"/proc/self/ns/{ns}")
            theirs = os.stat(f"/proc/{pid}/ns/{ns}")
        except FileNotFoundError:
            continue  # a namespace this kernel does not have
        except OSError as e:
            return f"cannot tell the caller's {ns} namespace: {e.strerror or e}"
        if (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino):
            return f"the caller is in another {ns} namespace"
    return None


def _answer(conn: socket.socket, msg: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        conn.send(json.dumps(msg).encode())


def _child(conn: socket.socket, started_with: dict[str, str]) -> int:
    """In the forked child: take the request, become the spare, wait for the launch."""
    try:
        data, fds, cut = wl.receive(conn)
    except OSError:
        return sp.EXIT_DONE
    try:
        if not data and not fds:
            return sp.EXIT_DONE  # the caller closed before asking: nothing to do
        if cut or len(fds) != 1:
            raise ConfigError("a request carries exactly one descriptor, whole")
        req = decode(data, started_with)
        differs = other_namespace(conn)
        if differs is not None:
            raise ConfigError(differs)
        os.chdir(req.cwd)
    except (ConfigError, OSError) as e:
        _answer(conn, {"refused": str(e)[:500]})
        return sp.EXIT_DONE
    os.setsid()
    os.dup2(fds[0], 1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 2)
    os.dup2(conn.fileno(), 0)
    conn.detach()
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the listener, other spares' sockets
    # The answer once the spare is what it says it is (its descriptors, its session).
    answer = socket.socket(fileno=0)
    _answer(answer, {"pid": os.getpid(), "zygote": os.getppid()})
    answer.detach()
    if req.mode == "main":
        sys.argv = list(req.argv)
        warm_driver.run_as_main(req.argv[0])
        return sp.EXIT_DONE
    # A module the zygote did not preload is imported here, in this spare only (as a
    # spare started the old way would); a failing import shows again after the launch.
    warm_driver.prepare(req.state_dir, req.argv[0])
    return warm_driver.serve(req.argv, started_with)


def _tell_exit(conn: socket.socket, status: int) -> None:
    """A reaped child's exit code to its caller (negative for a signal), then its end."""
    _answer(conn, {"exit": os.waitstatus_to_exitcode(status)})
    conn.close()


def serve(listener: socket.socket, started_with: dict[str, str]) -> socket.socket | None:
    """Fork a child per connection until stdin ends; returns only in a child (its
    connection), None in the zygote at the end."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    poller = select.poll()
    poller.register(0, select.POLLIN)
    poller.register(listener, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    children: dict[int, socket.socket] = {}
    by_fd: dict[int, int] = {}
    uid = os.getuid()
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for fd, ev in events:
            if fd == 0:
                if not os.read(0, 4096):
                    _end(children, by_fd, poller)
                    return None  # the starter is gone
            elif fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(children, by_fd, poller)
            elif fd == listener.fileno():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                pid_uid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                if int.from_bytes(pid_uid[4:8], sys.byteorder) != uid:
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for s in (listener, *children.values()):
                        s.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    return conn
                children[pid] = conn
                by_fd[conn.fileno()] = pid
                poller.register(conn, select.POLLRDHUP)
            elif ev & _HANGUP and fd in by_fd:
                # The caller hung up: nobody supervises its spare any more.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(by_fd[fd], signal.SIGKILL)
                poller.unregister(fd)
        _reap(children, by_fd, poller)


def _reap(children: dict[int, socket.socket], by_fd: dict[int, int], poller: select.poll) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        by_fd.pop(conn.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            poller.unregister(conn)
        _tell_exit(conn, status)


def _end(children: dict[int, socket.socket], by_fd: dict[int, int], poller: select.poll) -> None:
    """The campaign is over: none of its spares or drivers outlives it (killed and
    reaped, each caller told)."""
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while children:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            _tell_exit(conn, status)


def main(argv: list[str]) -> int:
    started_with = dict(os.environ)  # before any import of a driver's
    try:
        if not argv or not argv[0].isdigit():
            raise ConfigError("usage: warm_zygote <listening fd> [module ...]")
        listener = socket.socket(fileno=int(argv[0]))
        if listener.type != socket.SOCK_SEQPACKET or listener.family != socket.AF_UNIX:
            raise ConfigError(f"fd {argv[0]} is not a Unix SOCK_SEQPACKET socket")
        modules = [wl.check_module(m) for m in argv[1:]]
    except (ConfigError, OSError) as e:
        print(f"durable-spaces zygote: {e}", file=sys.stderr)
        return sp.EXIT_PERMANENT
    for module in modules:  # once, here: every fork has them
        with contextlib.suppress(Exception):  # a spare's own import shows the error
            importlib.import_module(module)
    conn = serve(listener, started_with)
    if conn is None:
        return sp.EXIT_DONE
    return _child(conn, started_with)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
