"""The fork server of a ``local`` Space: one long-lived process that forks each command's
supervisor, so a spawn costs a fork instead of an interpreter start.

Started by a driver's first spawn (``forkserver_client.py``, under the Space's lock) as
``python -I -S forkserver.py SPACE_DIR INSTANCE VERSION IDLE FAILPOINTS CGROUP`` in a
session of its own, stdlib only. It binds ``SPACE_DIR/forkserver.sock`` (relative to its
cwd; callers reach it through ``/proc/self/fd`` so a long state dir never meets the
108-byte limit of a socket path), listens, and says ``ready`` on stdout; the driver then
records it in ``forkserver.json`` (pid, create time, instance, version, cgroup).

For each connection from our own uid (SO_PEERCRED; any other is closed unread) it forks a
child and forgets it (SIGCHLD is ignored, so the kernel reaps). The child *is* the
per-command supervisor of ``supervisor.py``: it leaves the server's session (setsid),
reads the request (the command's directory), answers with its own pid, reads the spec to
EOF and calls ``supervisor.supervise``.

Whom it serves, in a Space whose epochs are contained (``CGROUP`` given: the Space's
cgroup as ``/proc/self/cgroup`` names it): only the Space's adapter, never a command of
a Space, though both run as the same uid (often root) and a command can reach the socket.
A peer in a cgroup of this Space is closed unread, and a child runs nothing unless,
when its spec has come, it is in an epoch's cgroup of this Space (``e<n>``): only its
caller can have put it there, and a command cannot write cgroupfs (``confine.py``). So a
command that asks (or a command of another Space, or a peer whose pid was reused) gets
a child that exits without running anything. The child applies the fence built once at
the server's start (``confine.py``) before it starts the command. The answer comes from
the child, so a server
killed right after its fork costs nothing; the caller records the child's pid before it
sends the spec, as with a directly started supervisor, and a connection closed before the
spec is a caller that died: nothing runs and the key reads ``lost``. Every supervisor
outlives its caller and the server: a killed server costs the next spawn a start.

The server carries no ``DS_SPACE`` / ``DS_EPOCH`` (``advance_epoch`` never targets it,
and a command gets the caller's env from the spec, never the server's); it carries
``DS_LOCAL_SERVER=<instance>`` (``MARK``), which ``restart`` and ``delete`` kill
(``procs.py``). It exits when its Space is gone or replaced, and after ``IDLE`` seconds
without a request, then under the Space's lock (no caller is between its look at the
server and its request) and removing its files only while ``forkserver.json`` is its own.
"""

from __future__ import annotations

# The C modules under ``socket``, ``signal`` and ``importlib.util``: this process starts
# on the first spawn of every Space (on the path of a run's first call), and the imports
# of those three (their enums, ``selectors``, ``contextlib``) cost it more than the
# interpreter's own start under -I -S (docs/performance.md).
import _frozen_importlib_external
import _signal
import _socket
import os
import struct
import sys
import time
from types import ModuleType

MAGIC = b"dsfork1\0"
SOCK = "forkserver.sock"
META = "forkserver.json"
LOG = "forkserver.log"
#: The environment mark of a Space's fork server (and of its children before they run a
#: command): ``DS_LOCAL_SERVER=<instance>``.
MARK = "DS_LOCAL_SERVER"
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def request(cmd_dir: str) -> bytes:
    """What a caller sends first: the magic and the command's directory."""
    path = cmd_dir.encode("utf-8", "surrogateescape")
    return MAGIC + len(path).to_bytes(4, "big") + path


def peer(sock: _socket.socket) -> tuple[int, int]:
    """(pid, uid) of the other end of a Unix socket (a ``socket.socket`` is one too)."""
    cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _CRED.size)
    pid, uid, _ = _CRED.unpack(cred)
    return pid, uid


def _recv_exact(conn: _socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _recv_all(conn: _socket.socket) -> bytes:
    parts = []
    while chunk := conn.recv(1 << 16):
        parts.append(chunk)
    return b"".join(parts)


def _load(name: str, path: str) -> ModuleType | None:
    """A stdlib-only sibling module by its path (we run with no package on sys.path),
    from its cached bytecode where there is some, as an import would."""
    if not os.path.exists(path):
        return None
    loader = _frozen_importlib_external.SourceFileLoader(name, path)
    mod = ModuleType(name)
    mod.__file__ = path
    sys.modules[name] = mod
    loader.exec_module(mod)
    return mod


def _child(
    conn: _socket.socket,
    listener: _socket.socket,
    supervisor: ModuleType,
    cgroup: str,
    fence: object,
) -> int:
    """One command's supervisor, forked: everything ``supervisor.main`` does, the spec read
    from ``conn`` after our pid went back on it."""
    listener.close()
    os.setsid()  # a session and process group of our own, led by us (``kill_space``)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # we wait for the command
    head = _recv_exact(conn, len(MAGIC) + 4)
    if head is None or not head.startswith(MAGIC):
        return 4
    raw = _recv_exact(conn, int.from_bytes(head[len(MAGIC) :], "big"))
    if raw is None:
        return 4
    cmd_dir = raw.decode("utf-8", "surrogateescape")
    log = os.open(
        os.path.join(cmd_dir, "supervisor.log"),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
        0o600,
    )
    os.dup2(log, 2)
    os.close(log)
    os.chdir(cmd_dir)
    conn.sendall(f"{os.getpid()}\n".encode())
    spec = _recv_all(conn)  # empty or torn: the caller died before handing it over
    conn.close()
    if cgroup and not _placed(cgroup):
        os.write(2, b"ds-local fork server child: not in an epoch's cgroup of the Space\n")
        return 7  # asked by someone who cannot place us: nothing runs
    code: int = supervisor.supervise(cmd_dir, spec, fence, inherited=True)
    return code


def own_cgroup(text: str) -> str | None:
    """This process's cgroup v2 from the text of ``/proc/<pid>/cgroup``."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def _placed(cgroup: str) -> bool:
    """Whether we are in an epoch's cgroup of the Space whose cgroup is ``cgroup``."""
    try:
        with open("/proc/self/cgroup") as f:
            mine = own_cgroup(f.read())
    except OSError:
        return False
    if mine is None or not mine.startswith(cgroup + "/e"):
        return False
    epoch = mine[len(cgroup) + 2 :]
    return epoch.isdigit() and epoch.isascii() and str(int(epoch)) == epoch


def _commands(pid: int, cgroup: str) -> bool:
    """Whether the process ``pid`` is in the cgroup ``cgroup`` or below it (a command of
    the Space), or cannot be told (gone)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            theirs = own_cgroup(f.read())
    except OSError:
        return True
    return theirs is None or theirs == cgroup or theirs.startswith(cgroup + "/")


def _gone(space_dir: str, instance: str) -> bool:
    try:
        with open(os.path.join(space_dir, "instance")) as f:
            return f.read().strip() != instance
    except OSError:
        return True


def _retire(space_dir: str) -> bool:
    """Take the Space's lock (never waiting: a caller holding it may be talking to us) and
    remove our files if they are still ours. True: exit now, the lock held until we do."""
    import fcntl
    import json

    try:
        fd = os.open(os.path.join(space_dir, "lock"), os.O_RDWR | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    try:  # bounded as host/bounded.py reads (stdlib only here): a FIFO never waited on
        meta = os.open(os.path.join(space_dir, META), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(meta, "rb") as f:
            mine = json.loads(f.read(4096)).get("pid") == os.getpid()
    except (OSError, ValueError, AttributeError, RecursionError):
        mine = False
    if mine:
        for name in (META, SOCK):
            try:  # noqa: SIM105 (``contextlib`` is one of the imports saved, above)
                os.unlink(os.path.join(space_dir, name))
            except OSError:
                pass
    return True


def main(args: list[str]) -> int:
    space_dir, instance, _version, idle = args[1], args[2], args[3], float(args[4])
    armed = args[5:6] == ["failpoints"]  # the client set DS_FAILPOINTS for them
    cgroup = args[6] if len(args) > 6 else ""  # the Space's cgroup: contained epochs
    here = os.path.dirname(os.path.abspath(__file__))
    supervisor = _load("ds_local_supervisor", os.path.join(here, "supervisor.py"))
    fence: object = None
    if cgroup:  # built once; a fence that cannot be built fails each command (exit 126)
        confine = _load("ds_local_confine", os.path.join(here, "confine.py"))
        try:
            if confine is None:
                raise OSError(0, "no confine.py")
            built = confine.build()
            built.deny_clone3()  # on us, once: every child inherits it
            fence = built
        except OSError as e:
            fence = e
    failpoints = None  # unarmed, its ``hit`` does nothing: not loaded (``signal``, threads)
    if armed:
        path = os.path.join(here, "..", "..", "chaos", "failpoints.py")
        failpoints = _load("ds_failpoints", path)
    if supervisor is None:
        return 2
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)  # our children are reaped by the kernel
    os.chdir(space_dir)
    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    listener.bind(SOCK)  # relative: the caller removed a stale one under the lock
    listener.listen(64)
    listener.settimeout(1.0)
    os.write(1, b"ready\n")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    last = time.monotonic()
    me = os.getuid()
    while True:
        try:
            fd, _ = listener._accept()  # type: ignore[attr-defined]  # (fd, address)
        except TimeoutError:
            if _gone(space_dir, instance):
                return 0
            if time.monotonic() - last > idle and _retire(space_dir):
                return 0
            continue
        last = time.monotonic()
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, fd)
        pid, uid = peer(conn)
        if uid != me or (cgroup and _commands(pid, cgroup)):
            conn.close()  # only our own uid may have commands run, and not a command
            continue
        conn.settimeout(None)
        pid = os.fork()
        if pid == 0:
            code = 5
            try:
                code = _child(conn, listener, supervisor, cgroup, fence)
            except BaseException as e:  # a child never returns into the loop
                os.write(2, f"ds-local fork server child: {e!r}\n".encode())
                code = 6
            finally:
                os._exit(code)
        if failpoints is not None:
            failpoints.hit("space.local.server_forked")
        conn.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
