"""Starting one command of a ``local`` Space: its environment, its directory and its
supervisor, born in its epoch's cgroup. ``LocalSpace.spawn`` calls it under the Space's
lock, after the ledger line (see ``local_space`` for the order and what a death at each step
leaves).

A supervisor is forked by the Space's fork server (``forkserver.py``, one per Space,
started by the first spawn) or else started directly as a fresh interpreter (``-I -S``,
stdlib only). A shell supervisor would be faster but cannot tell ``exit 130`` from death
by SIGINT, and forking the caller would copy a threaded driver; both were rejected.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from durable_spaces.backends.local.cgroups import SpaceCgroups
from durable_spaces.backends.local.disk import write_atomic
from durable_spaces.backends.local.forkserver_client import ForkServer
from durable_spaces.backends.local.procs import track
from durable_spaces.backends.local.supervisor import format_spec
from durable_spaces.chaos.failpoints import hit
from durable_spaces.host.proc_start import started

_SUPERVISOR = str(Path(__file__).with_name("supervisor.py"))
#: What commands inherit from the caller's environment: enough to find programs, nothing
#: of the driver's own (API keys, tokens, failpoints), as in a real sandbox.
_INHERIT = frozenset(
    [
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TERM",
        "TZ",
        "TMPDIR",
        "PYENV_ROOT",
        "PYENV_VERSION",
        "VIRTUAL_ENV",
        "DO_NOT_TRACK",
        "CUA_TELEMETRY",
    ]
)


def command_env(
    env: Mapping[str, str] | None, instance_id: str, epoch: int, cmd_id: str
) -> dict[str, str]:
    """A command's environment: what it inherits (``_INHERIT``, ``LC_*``), the caller's
    ``env``, and the Space, epoch and command it runs in."""
    out = {k: v for k, v in os.environ.items() if k in _INHERIT or k.startswith("LC_")}
    out.update(env or {})
    out.update(DS_SPACE=instance_id, DS_EPOCH=str(epoch), DS_CMD=cmd_id)
    return out


def launch(
    server: ForkServer,
    cgroups: SpaceCgroups,
    cmd_dir: Path,
    *,
    epoch: int,
    key: str | None,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    stdin: bytes | None,
) -> tuple[int, float, subprocess.Popen[bytes] | None]:
    """Start ``argv`` in ``cmd_dir``: a supervisor, its pid and create time recorded in
    ``meta.json``, moved into epoch ``epoch``'s cgroup, and only then handed the command
    (so nothing of it runs outside the cgroup). Its pid, create time, and its ``Popen``
    when it was started directly."""
    cmd_dir.mkdir(exist_ok=True)
    (cmd_dir / "output").write_bytes(b"")
    if stdin is not None:
        (cmd_dir / "stdin").write_bytes(stdin)
    forked = server.fork(cmd_dir)
    popen = None
    if forked is not None:
        pid, ctime = forked.pid, forked.ctime
    else:
        fence = ["confine"] if cgroups.fenced_as else []  # ``confine.py``
        with open(cmd_dir / "supervisor.log", "wb") as log:
            popen = subprocess.Popen(
                [sys.executable, "-I", "-S", _SUPERVISOR, str(cmd_dir), *fence],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=cmd_dir,
                env=env,
                start_new_session=True,
            )
        track(popen)
        pid, ctime = popen.pid, started(popen.pid)
    meta = {"pid": pid, "ctime": ctime, "epoch": epoch, "key": key}
    try:
        write_atomic(cmd_dir / "meta.json", json.dumps(meta).encode(), fsync=False)
        hit("space.local.supervisor_recorded")  # dying here: the command never starts
        spec = format_spec(cwd, argv, env)
        # Born in its epoch's cgroup: the supervisor waits for the spec, so the
        # command and all it starts are in it (``cgroups.py``).
        cgroups.enter(epoch, pid)
    except BaseException:
        if forked is not None:
            forked.conn.close()  # its child reads EOF now: nothing runs
        elif popen is not None and popen.stdin is not None:
            popen.stdin.close()  # as above: an empty spec runs nothing
        raise
    if forked is not None:
        forked.send(spec)
    else:
        assert popen is not None and popen.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            popen.stdin.write(spec)
            popen.stdin.close()
    return pid, ctime, popen
