"""The warm launch contract: how a coordinator hands a pre-started driver its attempt.

A *spare* is a driver process started before its epoch exists::

    <python> -m durable_spaces.drive.warm_driver <state_dir> <module> [args...]

with stdin one end of a ``SOCK_SEQPACKET`` Unix socket pair, stdout the pipe its
coordinator will read, stderr ``/dev/null``, in a session of its own. It imports
``<module>``, calls the module's ``warm_up(state_dir)`` if it has one (imports, runtimes:
never the log, never a Space) and waits. The coordinator launches it with one message: a
JSON object ::

    {"v": 1, "epoch": <n>, "argv": [<module>, args...], "env": {"NAME": "value", ...}}

carrying exactly one file descriptor (``SCM_RIGHTS``): the attempt's stderr,
``drivers/epoch-<n>.log`` opened for appending. The spare then becomes exactly what
``<python> -m <module> [args...]`` with that environment and that stderr is: the same
pid, process group, stdout pipe and exit codes; a SIGKILL is a SIGKILL either way.

Reading is strict (``decode``): a message that is not exactly that (unknown or missing
keys, an epoch that is not ``CUA_SESSION_EPOCH``, argv other than the spare's, a name or
value with a NUL, no descriptor or more than one, a descriptor that is not a file open
for writing, a truncated message) ends the spare with exit 78 and one line, never a
traceback. End of file before any message (the coordinator closed the spare, or died)
ends it with exit 0 having done nothing.

Only variables read at run time may differ between the spare's environment and the
launch's: ``CUA_SESSION_*`` (read by the driver entry) and the failpoints' (re-armed at
launch). Modules read others when imported (``DS_MUTANTS``, ``PYTHON*``, ...), which a
spare has already done, so a launch whose environment differs in any other variable is
spawned cold instead (``cold_reason``).
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import re
import socket
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from durable_spaces.drive import protocol as sp
from durable_spaces.errors import ConfigError
from durable_spaces.host.bounded import parse_json

VERSION = 1
WARM_MODULE = "durable_spaces.drive.warm_driver"
#: A message is an environment and an argv: far below this.
MAX_MESSAGE = 1 << 20
MAX_VARS = 4096
#: Read at run time, so a launch may set them: the session's, the failpoints'.
RUNTIME_VARS = frozenset(
    {sp.NAME, sp.EPOCH, sp.STATE_DIR, sp.HEARTBEAT_SECS, sp.SPACE}
    | {"DS_FAILPOINTS", "DS_FAILPOINT_TRACE"}
)
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)
_KEYS = {"v", "epoch", "argv", "env"}


@dataclass(frozen=True)
class WarmLaunch:
    """A checked launch message: the attempt's epoch, argv (module first) and env."""

    epoch: int
    argv: list[str]
    env: dict[str, str]


def check_module(raw: str) -> str:
    """A dotted module name (what ``-m`` takes)."""
    if not _MODULE.fullmatch(raw):
        raise ConfigError(f"not a module name: {raw[:80]!r}")
    return raw


def spare_argv(argv: Sequence[str], state_dir: str | os.PathLike[str]) -> list[str] | None:
    """The spare's command line for a driver ``argv`` of the form ``<python> -m <module>
    [args...]``; None for any other form (those are always spawned cold)."""
    if len(argv) < 3 or argv[1] != "-m" or not _MODULE.fullmatch(argv[2]):
        return None
    return [argv[0], "-m", WARM_MODULE, str(state_dir), *argv[2:]]


def spare_env(launch_env: Mapping[str, str]) -> dict[str, str]:
    """A spare's environment: a launch's without the variables read at run time."""
    return {k: v for k, v in launch_env.items() if k not in RUNTIME_VARS}


def cold_reason(spare: Mapping[str, str], launch_env: Mapping[str, str]) -> str | None:
    """Why a spare started with ``spare`` cannot take a launch with ``launch_env`` (a
    variable read at import differs), or None when it can."""
    for k in sorted(set(spare) | set(launch_env)):
        if k not in RUNTIME_VARS and spare.get(k) != launch_env.get(k):
            return f"{k} differs from the spare's environment"
    return None


def encode(epoch: int, argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """The launch message (``argv``: the module and its arguments)."""
    data = json.dumps(
        {"v": VERSION, "epoch": epoch, "argv": list(argv), "env": dict(env)},
        separators=(",", ":"),
    ).encode()
    if len(data) > MAX_MESSAGE:
        raise ConfigError(f"a launch message of {len(data)} bytes is over {MAX_MESSAGE}")
    return data


def send(sock: socket.socket, data: bytes, fd: int) -> None:
    """One message with one descriptor (``OSError`` if the spare is gone)."""
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def receive(sock: socket.socket) -> tuple[bytes, list[int], bool]:
    """One message: its bytes, the descriptors it carried, and whether anything was cut
    off (the message or its descriptors)."""
    fds = array.array("i")
    data, anc, flags, _ = sock.recvmsg(MAX_MESSAGE + 1, socket.CMSG_SPACE(4 * fds.itemsize))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    cut = bool(flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC)) or len(data) > MAX_MESSAGE
    return data, list(fds), cut


def _text(what: str, v: object) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{what} must be a string, got {type(v).__name__}")
    if "\x00" in v:
        raise ConfigError(f"{what} holds a NUL byte")
    return v


def decode(data: bytes, expect_argv: Sequence[str]) -> WarmLaunch:
    """A launch message, checked strictly (``ConfigError`` names what is wrong)."""
    try:
        msg = parse_json(data.decode("utf-8"), where="the launch message")
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"the launch message is not JSON: {e}") from None
    if not isinstance(msg, dict):
        raise ConfigError("the launch message must be a JSON object")
    if set(msg) != _KEYS:
        raise ConfigError(f"the launch message must have exactly the keys {sorted(_KEYS)}")
    if msg["v"] != VERSION or isinstance(msg["v"], bool):
        raise ConfigError(f"unknown launch message version {msg['v']!r}")
    argv, env = msg["argv"], msg["env"]
    if not isinstance(argv, list) or [_text("argv", a) for a in argv] != list(expect_argv):
        raise ConfigError("the launch argv is not the one this spare was started for")
    if not isinstance(env, dict) or len(env) > MAX_VARS:
        raise ConfigError(f"env must be an object of at most {MAX_VARS} variables")
    for k, v in env.items():
        if not k or "=" in _text("a variable name", k):
            raise ConfigError(f"bad variable name {k[:60]!r}")
        _text(f"the value of {k[:60]}", v)
    epoch = msg["epoch"]
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise ConfigError("epoch must be an integer")
    if env.get(sp.EPOCH) != str(epoch):
        raise ConfigError(f"epoch {epoch} is not {sp.EPOCH} of the launch's environment")
    sp.parse_epoch(sp.EPOCH, env[sp.EPOCH])
    return WarmLaunch(epoch, list(argv), dict(env))


def check_stderr(fd: int) -> None:
    """The descriptor a launch gives for stderr: a regular file open for writing."""
    try:
        st = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError as e:
        raise ConfigError(f"the launch's stderr descriptor is unusable: {e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError("the launch's stderr descriptor is not a regular file")
    if flags & os.O_ACCMODE not in (os.O_WRONLY, os.O_RDWR):
        raise ConfigError("the launch's stderr descriptor is not open for writing")
