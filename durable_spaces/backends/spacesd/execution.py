"""Commands of a daemon-backed Space: one followed through the daemon's output stream
(``SpacesdExecution``), one replayed from the exec ledger (``RecordedExecution``), and
the ledger's records as ``ExecRecord``.

The SDK's output stream reconnects on its own when the daemon goes away, and would
follow a *new* process with the same pid after a restart. So every event is checked
against the daemon's boot identity (the backend's ``DaemonProbe``), and a pending read
is abandoned (``SpaceUnavailableError``) when the daemon is down: a restart is never
mistaken for a command's exit.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import cua

from durable_spaces.backends.spacesd.errormap import ErrorMap
from durable_spaces.space import (
    BoundedOutput,
    ExecRecord,
    ExecResult,
    ExecState,
    OutputCallback,
)

#: Stdin goes to the daemon in pieces of this size.
STDIN_CHUNK = 1 << 20
_STATES = {
    "EXEC_STATE_RUNNING": ExecState.RUNNING,
    "EXEC_STATE_EXITED": ExecState.EXITED,
    "EXEC_STATE_LOST": ExecState.LOST,
}
#: How often a pending output read checks that the daemon is still the same one.
WATCH_INTERVAL = 0.5


def _b64(s: str | None) -> bytes:
    return base64.b64decode(s) if s else b""


def exit_fields(info: Any, lost: bool) -> tuple[int | None, int | None, bytes]:
    """(exit_code, signal, extra output) from an SDK ``ExitInfo``.

    A command the daemon could not start (``error`` with no code) gets 127 and the error
    as output, like a shell; a LOST one has no status at all."""
    if info is None or lost:
        return None, None, b""
    if info.code is not None:
        return int(info.code), None, b""
    if info.signal_number:
        return None, int(info.signal_number), b""
    if info.error:
        return 127, None, f"cua-spacesd: {info.error}\n".encode()
    return None, None, b""


def parse_record(key: str, rec: Any) -> ExecRecord:
    if not rec:
        return ExecRecord(key=key, state=ExecState.UNKNOWN)
    state = _STATES.get(str(rec.get("state")), ExecState.UNKNOWN)
    end = rec.get("end") or {}
    code: int | None = end.get("exitCode")
    sig: int | None = end.get("signalNumber")
    if state == ExecState.EXITED and code is None and sig is None:
        code = 127 if end.get("error") else 0
    tail = b"".join(
        _b64(part.get("stdout") or part.get("stderr") or part.get("pty"))
        for part in rec.get("tail") or []
    )
    pid = rec.get("pid")
    return ExecRecord(
        key=key,
        state=state,
        epoch=int(rec.get("epoch", 0)),
        pid=int(pid) if pid else None,
        exit_code=None if code is None else int(code),
        signal=None if sig is None else int(sig),
        output_tail=tail,
    )


class SpacesdExecution:
    """A command followed through the daemon's output stream."""

    def __init__(
        self,
        errors: ErrorMap,
        proc: Any,
        key: str | None,
        boot: str | None,
        *,
        reattached: bool,
        replayed: bool,
        lost: bool,
        on_output: OutputCallback | None = None,
        keep_output: int | None = None,
    ) -> None:
        self.key = key
        self.pid: int | None = int(proc.pid()) or None
        self.reattached = reattached
        self.replayed = replayed
        self._lost = lost
        self._errors = errors
        self._proc = proc
        self._boot = boot
        self._on_output = on_output
        self._out = BoundedOutput(keep_output)
        #: Only helpers that parse their stdout (unbounded) keep it apart.
        self._stdout: bytearray | None = bytearray() if keep_output is None else None
        self._exit: Any = None
        self._done = False
        self._pending: asyncio.Future[Any] | None = None

    async def _next_event(self) -> Any:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._proc.next_event())
        while True:
            done, _ = await asyncio.wait({self._pending}, timeout=WATCH_INTERVAL)
            if done:
                break
            if self._errors.probe.boot_id() != self._boot:
                self._pending.cancel()
                self._pending = None
                raise self._errors.down("the Space's daemon stopped while the command ran")
        fut, self._pending = self._pending, None
        try:
            ev = fut.result()
        except cua.CuaError as e:
            if isinstance(e, cua.CuaError.NotFound):
                raise self._errors.down(
                    "the Space's daemon restarted while the command ran"
                ) from None
            raise self._errors.map(e) from None
        if self._errors.probe.boot_id() != self._boot:
            raise self._errors.down("the Space's daemon restarted while the command ran")
        return ev

    async def _next_chunk(self) -> bytes | None:
        while not self._done:
            ev = await self._next_event()
            if ev is None:
                self._done = True
                break
            if ev.kind == cua.ProcessEventKind.EXIT:
                self._exit = ev.exit
                continue
            data = bytes(ev.data)
            if not data:
                continue
            self._out.add(data)
            if ev.kind == cua.ProcessEventKind.STDOUT and self._stdout is not None:
                self._stdout += data
            if self._on_output is not None:
                self._on_output(data)
            return data
        return None

    async def output(self) -> AsyncIterator[bytes]:
        while (chunk := await self._next_chunk()) is not None:
            yield chunk

    async def wait(self) -> ExecResult:
        while await self._next_chunk() is not None:
            pass
        code, sig, extra = exit_fields(self._exit, self._lost)
        if extra:
            self._out.add(extra)
        return ExecResult(
            key=self.key,
            exit_code=code,
            signal=sig,
            output=self._out.value(),
            replayed=self.replayed,
            reattached=self.reattached,
            output_bytes=self._out.total,
        )

    async def detach(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if not self._done:
            self._done = True
            try:
                await self._proc.detach()
            except cua.CuaError as e:
                raise self._errors.map(e) from None

    def stdout(self) -> bytes:
        """Only stdout (for helpers that parse it; empty when ``keep_output`` bounded it)."""
        return bytes(self._stdout or b"")

    async def feed(self, data: bytes) -> None:
        """Send ``data`` to the command's stdin (spawned with ``stdin=True``), then close it."""
        await self.send(data)
        await self.close_input()

    async def send(self, data: bytes) -> None:
        """Send ``data`` to the command's stdin, keeping it open (a conversation with a
        helper that answers each request: ``guest_journal``)."""
        try:
            for i in range(0, len(data), STDIN_CHUNK):
                await self._proc.write_stdin(data[i : i + STDIN_CHUNK])
        except Exception as e:
            raise self._errors.map(e) from None

    async def close_input(self) -> None:
        """Close the command's stdin (it reads end of file)."""
        try:
            await self._proc.close_stdin()
        except Exception as e:
            raise self._errors.map(e) from None


class RecordedExecution:
    """A replay: the command already ended (or was lost); nothing runs."""

    def __init__(self, rec: ExecRecord, on_output: OutputCallback | None = None) -> None:
        self.key: str | None = rec.key
        self.pid = rec.pid
        self.reattached = False
        self.replayed = True
        self._rec = rec
        self._on_output = on_output
        self._sent = False

    async def output(self) -> AsyncIterator[bytes]:
        if not self._sent:
            self._sent = True
            if self._rec.output_tail:
                if self._on_output is not None:
                    self._on_output(self._rec.output_tail)
                yield self._rec.output_tail

    async def wait(self) -> ExecResult:
        async for _ in self.output():
            pass
        return ExecResult(
            key=self.key,
            exit_code=self._rec.exit_code,
            signal=self._rec.signal,
            output=self._rec.output_tail,
            replayed=True,
        )

    async def detach(self) -> None:
        self._sent = True

    def stdout(self) -> bytes:
        return self._rec.output_tail

    async def feed(self, data: bytes) -> None:
        """Nothing runs: a replay takes no input."""
