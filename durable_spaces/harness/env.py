"""The execution environment: where a conversation's tools read, write and run commands.

The built-in tools act only through an ``ExecutionEnv``, never on the host directly, so the
adapter can swap in a Space (with its exec ledger and epoch fence) without touching them.
``LocalDirEnv`` is the plain stand-in: a local directory, commands through ``bash -c``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from durable_spaces.errors import PathEscapeError
from durable_spaces.space import confine


class CallIdentity(Protocol):
    """Which tool call runs a command (``tools.ToolContext`` is one): what an env may key a
    command by. A protocol, so the env below the tools does not import them."""

    conversation_id: str
    call_id: str
    attempt: int


@dataclass(frozen=True)
class CommandResult:
    """How a command ended: ``exit_code`` is None when it was killed (timeout, signal)."""

    exit_code: int | None
    output: bytes


@runtime_checkable
class ExecutionEnv(Protocol):
    """What a tool may do to its conversation's workspace.

    Paths are workspace-relative (or absolute under ``cwd``); anything that would leave the
    workspace raises ``PathEscapeError``.
    """

    cwd: str

    async def exec(
        self,
        command: str,
        *,
        ctx: CallIdentity | None = None,
        on_output: Callable[[bytes], None] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``command`` with ``bash -c`` in ``cwd``; stdout and stderr interleaved.
        ``ctx`` lets an env key the command by call (a Space's idempotency key)."""
        ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes) -> None:
        """Write the whole file, creating parent directories."""
        ...

    async def exists(self, path: str) -> bool: ...


class LocalDirEnv:
    """A local directory as the workspace. No ledger: a command cut off by a crash is lost."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.cwd = os.path.realpath(os.fspath(root))

    def _path(self, path: str) -> str:
        rel = confine(self.cwd, path)
        full = os.path.join(self.cwd, rel)
        # The symlink half of confinement: the real path must stay under the root.
        real = os.path.realpath(full)
        if real != self.cwd and not real.startswith(self.cwd + os.sep):
            raise PathEscapeError(f"path leaves the workspace through a symlink: {path!r}")
        return full

    async def exec(
        self,
        command: str,
        *,
        ctx: CallIdentity | None = None,
        on_output: Callable[[bytes], None] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            command,
            cwd=self.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # so a timeout can kill the whole process group
        )
        chunks: list[bytes] = []

        async def pump() -> None:
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(65536):
                chunks.append(chunk)
                if on_output is not None:
                    on_output(chunk)

        try:
            await asyncio.wait_for(pump(), timeout)
        except TimeoutError:
            await _kill(proc)
            return CommandResult(None, b"".join(chunks))
        except asyncio.CancelledError:
            await _kill(proc)
            raise
        code = await proc.wait()
        return CommandResult(code, b"".join(chunks))

    async def read_file(self, path: str) -> bytes:
        # Non-blocking and checked: opening a FIFO for reading would wait for a writer.
        if not path:
            raise IsADirectoryError(errno.EISDIR, "the path is empty: name a file")
        fd = os.open(self._path(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which names the fd
            dir_ = stat.S_ISDIR(os.fstat(fd).st_mode)
            os.close(fd)
            what = "a directory, not a file" if dir_ else "not a regular file"
            raise IsADirectoryError(errno.EISDIR, f"{path!r} is {what}")
        with os.fdopen(fd, "rb") as f:
            return f.read()

    async def write_file(self, path: str, data: bytes) -> None:
        full = self._path(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        tmp = f"{full}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, full)  # a reader never sees half a file

    async def exists(self, path: str) -> bool:
        return os.path.lexists(self._path(path))


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()
