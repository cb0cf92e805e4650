"""The supervisor of one command of a ``local`` Space.

Run by ``LocalSpace.spawn`` as ``python -I -S supervisor.py CMD_DIR [confine]`` in a session
of its own, or forked by the Space's fork server (``forkserver.py``, which then calls
``supervise`` with the spec read from its socket instead of stdin): a script rather than
``-m`` so that starting it imports no site and no package, and stdlib only
for the same reason. It outlives its caller on purpose: a
driver that is SIGKILLed leaves the command running, and the next driver reattaches by
reading ``CMD_DIR/output`` and waiting for ``CMD_DIR/status``.

Protocol with the caller:

1. The caller records our pid and create time, then writes the spec to our stdin and
   closes it: NUL-separated ``ds1, cwd, argc, argv..., KEY=VALUE..., end`` (not JSON:
   importing json costs more than everything else here). Empty or torn stdin means the
   caller died before recording us: we exit without running anything (the key then
   reads ``lost``).
2. The command runs with stdout and stderr appended to ``CMD_DIR/output`` and stdin from
   ``CMD_DIR/stdin`` (or /dev/null), in a process group of its own: a command that
   signals its own group (``kill 0``, a shell's job control) must not kill us, or its
   outcome would read ``lost`` and the session would loop on it. The Space's kill finds
   it anyway (our children, and its ``DS_SPACE`` mark).
   With ``confine`` (a Space whose epochs are contained), the command starts under the
   fence of ``confine.py`` (Landlock and seccomp): it cannot leave its epoch's cgroup. A
   fence that cannot be applied runs nothing (exit 126, the reason in the output).
3. When it ends: fsync the output, write ``CMD_DIR/status`` atomically (tmp, fsync,
   rename), exit. A status file therefore always means a complete output. The directory
   is not fsynced: a host crash kills the command too, and a status lost with it reads
   ``lost``, which is the truth (outcome unknown).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

TYPE_CHECKING = False  # not ``typing``'s: importing typing costs more than this whole file
if TYPE_CHECKING:
    from durable_spaces.backends.local.confine import CgroupFence


def _write_atomic(directory: str, name: str, data: bytes) -> None:
    tmp = os.path.join(directory, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(directory, name))


def parse_spec(raw: bytes) -> tuple[str, list[str], dict[str, str]] | None:
    """(cwd, argv, env) from the caller's spec, or None when it is torn."""
    fields = [f.decode("utf-8", "surrogateescape") for f in raw.split(b"\0")]
    if len(fields) < 4 or fields[0] != "ds1" or fields[-1] != "end":
        return None
    argc = int(fields[2])
    argv = fields[3 : 3 + argc]
    env = dict(kv.split("=", 1) for kv in fields[3 + argc : -1])
    return fields[1], argv, env


def format_spec(cwd: str, argv: list[str], env: dict[str, str]) -> bytes:
    fields = ["ds1", cwd, str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items()), "end"]
    return "\0".join(fields).encode("utf-8", "surrogateescape")


def load_confine() -> ModuleType:
    """``confine.py`` beside this file, loaded by its path (we run with no package on
    sys.path), from its cached bytecode where there is some."""
    import _frozen_importlib_external

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "confine.py")
    mod = ModuleType("ds_local_confine")
    mod.__file__ = path
    sys.modules[mod.__name__] = mod
    _frozen_importlib_external.SourceFileLoader(mod.__name__, path).exec_module(mod)
    return mod


def main(args: list[str]) -> int:
    fence: CgroupFence | OSError | None = None
    if args[2:3] == ["confine"]:
        try:
            fence = load_confine().build()
        except OSError as e:
            fence = e  # said in the command's output by ``supervise``
    return supervise(args[1], sys.stdin.buffer.read(), fence)


def supervise(
    cmd_dir: str, raw: bytes, fence: CgroupFence | OSError | None = None, inherited: bool = False
) -> int:
    """Run the command ``raw`` (the caller's spec, read to its end) specifies; also the
    body of a fork server's child (``forkserver.py``), which reads it from its socket.
    ``fence``: a ``confine.CgroupFence`` to apply before the command starts (or the OSError that
    kept it from being built: nothing runs); ``inherited``: its seccomp half is already
    on this process (a fork server's child)."""
    spec = parse_spec(raw)
    if spec is None:
        return 3  # the caller died before handing over the command: never run it
    cwd, argv, env = spec
    # posix_spawnp resolves argv[0] on *our* PATH: make it the command's (a no-op when we
    # were started with the command's env; a fork server's child has the server's).
    if env.get("PATH") != os.environ.get("PATH"):
        if "PATH" in env:
            os.environ["PATH"] = env["PATH"]
        else:
            os.environ.pop("PATH", None)
    out = os.open(
        os.path.join(cmd_dir, "output"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
        0o600,
    )
    stdin_path = os.path.join(cmd_dir, "stdin")
    inp = os.open(
        stdin_path if os.path.exists(stdin_path) else os.devnull, os.O_RDONLY | os.O_CLOEXEC
    )
    try:
        if isinstance(fence, BaseException):
            raise fence
        if fence is not None:  # this process and all it starts, for good
            fence.restrict() if inherited else fence.apply()
    except OSError as e:
        why = f"ds-local: cannot fence the command in its epoch: {e.strerror or e}\n"
        os.write(out, why.encode())
        os.fsync(out)
        os.close(out)
        _write_atomic(cmd_dir, "status", b'{"exit_code": 126, "signal": null}')
        return 0
    try:
        os.chdir(cwd)
        # posix_spawnp (not subprocess: importing it costs more than the rest of this file)
        # resolves argv[0] on our PATH, made the command's PATH above.
        pid = os.posix_spawnp(
            argv[0],
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, inp, 0),
                (os.POSIX_SPAWN_DUP2, out, 1),
                (os.POSIX_SPAWN_DUP2, out, 2),
            ],
            setpgroup=0,
        )
    except OSError as e:
        code = 127 if isinstance(e, FileNotFoundError) else 126
        os.write(out, f"ds-local: cannot run {argv[0]!r}: {e.strerror}\n".encode())
        status = f'{{"exit_code": {code}, "signal": null}}'
    else:
        # Out of the workspace while the command runs: a look for processes it left
        # there (adapter/leftovers.py) must not find this one, which exits only after
        # writing the status the adapter reads first.
        os.chdir(cmd_dir)
        _, wstatus = os.waitpid(pid, 0)
        if os.WIFSIGNALED(wstatus):
            status = f'{{"exit_code": null, "signal": {os.WTERMSIG(wstatus)}}}'
        else:
            code = os.waitstatus_to_exitcode(wstatus)
            status = f'{{"exit_code": {code}, "signal": null}}'
    # Out of the command's cwd before its status says it ended: a supervisor still in the
    # workspace then is a process the command left to its caller's look
    # (``adapter/leftovers.py``), and auto mode left transactional mode for it.
    os.chdir("/")
    os.fsync(out)
    os.close(out)
    _write_atomic(cmd_dir, "status", status.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
