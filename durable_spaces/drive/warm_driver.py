"""A warm driver: a driver process started before its epoch, so a resume costs the log
replay rather than an interpreter start and its imports.

    <python> -m durable_spaces.drive.warm_driver <state_dir> <module> [args...]

``durable_spaces/drive/warm_launch.py`` is the contract (what the coordinator sends, what is
refused). Before its launch message a spare imports ``<module>`` and runs the module's
``warm_up(state_dir)`` if it has one, and nothing else: it has no epoch, no session
environment, and never opens the log or a Space. The launch gives it its stderr, its
environment and its argv; from then on it is ``<python> -m <module> [args...]`` (same
pid, process group, stdout pipe and exit codes). A launch message it cannot trust ends
it with exit 78 and one line; end of file before any message ends it with exit 0.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import runpy
import socket
import sys
from pathlib import Path

from durable_spaces.chaos import failpoints
from durable_spaces.drive import protocol as sp
from durable_spaces.drive import warm_launch as wl
from durable_spaces.errors import ConfigError


def _refuse(err: ConfigError, fd: int | None = None) -> int:
    """One line (on the launch's stderr when it gave a usable one) and exit 78."""
    line = f"durable-spaces warm driver: bad launch: {err}\n".encode()
    with contextlib.suppress(OSError):
        os.write(fd if fd is not None else 2, line)
    return sp.EXIT_PERMANENT


def prepare(state_dir: Path, module: str) -> None:
    """Imports and the module's ``warm_up``: best effort, since a failure here happens
    again after the launch (where its traceback reaches the attempt's log), exactly as in
    a cold driver."""
    try:
        mod = importlib.import_module(module)
        warm_up = getattr(mod, "warm_up", None)
        if callable(warm_up):
            warm_up(state_dir)
    except Exception:
        pass


def _become(launch: wl.WarmLaunch, sock: socket.socket, fd: int) -> None:
    """Take the launch's stderr, stdin /dev/null (as a cold driver's), its argv and its
    variables read at run time; the failpoints are armed from them. Only those change:
    the rest of the launch's environment is the spare's own (checked in ``main``), and
    what the spare's imports wrote into it (``setdefault``s) stays, as in a cold driver
    whose imports ran after its environment was set."""
    os.dup2(fd, 2)
    os.close(fd)
    sock.detach()  # fd 0 becomes /dev/null below; the socket must not close it later
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for k in sorted(wl.RUNTIME_VARS):
        if k in launch.env:
            os.environ[k] = launch.env[k]
        else:
            os.environ.pop(k, None)
    failpoints.arm()
    sys.argv = list(launch.argv)


def main(argv: list[str]) -> int:
    try:
        if len(argv) < 2:
            raise ConfigError("usage: warm_driver <state_dir> <module> [args...]")
        state_dir = sp.check_state_dir("state_dir", argv[0])
        module = wl.check_module(argv[1])
    except ConfigError as e:
        return _refuse(e)
    # Before any import of the driver's: this module's own imports write no variable.
    started_with = dict(os.environ)
    prepare(state_dir, module)
    return serve(argv[1:], started_with)


def serve(module_argv: list[str], started_with: dict[str, str]) -> int:
    """Wait on fd 0 (the launch socket) for the launch, then become the driver
    ``<python> -m <module_argv>``; ``started_with`` is the environment the imports saw.
    A spare forked by the zygote (``drive/warm_zygote.py``) comes here too."""
    try:
        sock = socket.socket(fileno=0)
    except OSError as e:
        return _refuse(ConfigError(f"stdin is not the launch socket: {e.strerror or e}"))
    try:
        data, fds, cut = wl.receive(sock)
    except (ConnectionResetError, BrokenPipeError):
        return sp.EXIT_DONE  # the coordinator is gone: never launched
    except OSError as e:
        return _refuse(ConfigError(f"the launch socket failed: {e.strerror or e}"))
    if not data and not fds:
        return sp.EXIT_DONE  # end of file: closed before any launch
    usable: int | None = None
    try:
        if cut:
            raise ConfigError("the launch message or its descriptors were cut off")
        if len(fds) != 1:
            raise ConfigError(f"a launch carries exactly one descriptor, not {len(fds)}")
        wl.check_stderr(fds[0])
        usable = fds[0]
        launch = wl.decode(data, module_argv)
        differs = wl.cold_reason(started_with, launch.env)
        if differs is not None:
            raise ConfigError(f"the launch cannot be taken warm: {differs}")
    except ConfigError as e:
        return _refuse(e, usable)
    finally:
        for extra in fds:
            if extra != usable:
                os.close(extra)
    _become(launch, sock, fds[0])
    run_as_main(module_argv[0])
    return sp.EXIT_DONE


def run_as_main(module: str) -> None:
    """Run ``module`` as ``python -m`` does: as ``__main__``, its own name not imported
    yet. A warm process imported it under its name (``prepare``, the zygote's preload);
    left there, runpy warns on the driver's stderr that the code runs beside that copy.
    Modules that took names from the warm copy keep them, as a cold driver's would keep
    those of a copy imported by its own imports."""
    sys.modules.pop(module, None)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
