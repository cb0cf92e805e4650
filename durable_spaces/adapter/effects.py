"""A wrapped call's effect: its command in the Space, or its file operation.

The command runs under the call's idempotency key (recorded by the Space's ledger before
it starts), with the call's ``timeout`` living in the Space beside it (coreutils
``timeout``, so a reattached or replayed command keeps it and it holds with no driver
alive), its output bounded (``OUTPUT_KEEP_BYTES`` kept in memory, in the result and in
what is streamed live) and the live stream fenced. A file operation works on bytes and
carries the caller's epoch like every mutation of a Space.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from durable_spaces.adapter.tool_args import BashArgs, EditArgs, ToolArgs, WriteArgs
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import StaleEpochError
from durable_spaces.harness.log import Fence
from durable_spaces.harness.tools import ToolContext
from durable_spaces.space import (
    MAX_SCAN_DEPTH,
    ExecResult,
    PathTable,
    Space,
    confine,
    name_problem,
)

STREAM_FENCE_INTERVAL = 0.2
RUNNING_MARK = 0.05
#: A wrapped command's output kept for its result (head and tail; the rest counted), and
#: the most it streams live: the log must not grow by what a command prints.
OUTPUT_KEEP_BYTES = 1 << 20
#: Exit status of coreutils ``timeout`` when the time ran out.
TIMED_OUT = 124
#: The variable a wrapped command finds its call's stable key in (``ToolContext.call_key``,
#: the session's namespace before it): the same for every attempt of the call, so a
#: request the command makes to a service outside the Space can carry it as its
#: idempotency key (docs/configuration.md).
CALL_KEY = "DS_CALL_KEY"


def name_issue(args: ToolArgs, space: Space) -> str | None:
    """Why the image could not hold the file a write/edit names (checked before it is
    written: written first and refused after, it would leave the workspace ahead of the
    log)."""
    if isinstance(args, BashArgs):
        return None
    rel = confine(space.root, args.path)
    for part in rel.split("/"):
        if (why := name_problem(part)) is not None:
            return f"{args.path!r}: {why}"
    if rel.count("/") >= MAX_SCAN_DEPTH:
        return f"{args.path!r}: deeper than {MAX_SCAN_DEPTH} levels"
    return None


def written_size(args: ToolArgs, space: Space, table: PathTable) -> tuple[str, int] | None:
    """The file a write/edit will leave and its size, known before it runs (an edit's
    from the file's size in ``table`` and its texts; None: a command, or an edit of no
    file, which fails anyway)."""
    if isinstance(args, WriteArgs):
        return confine(space.root, args.path), len(args.content.encode())
    if isinstance(args, EditArgs):
        rel = confine(space.root, args.path)
        old = table.get(rel)
        if old is None or old.kind != "file":
            return None
        return rel, old.size - len(args.old_text.encode()) + len(args.new_text.encode())
    return None


class Effect:
    """The effect of one call attempt (``args`` checked by ``tool_args.parse``)."""

    def __init__(
        self,
        args: ToolArgs,
        ctx: ToolContext,
        fence: Fence | None,
        cwd: str | None,
        namespace: str | None = None,
    ) -> None:
        self.args = args
        self.ctx = ctx
        self.fence = fence
        self.cwd = cwd
        self.namespace = namespace
        self._fence_checked = 0.0
        self._fence_ok = True
        self._streamed = 0
        #: sha256 -> bytes this attempt's write/edit wrote: the image's blob for the file
        #: when the scan after it finds that content there (it is never read back).
        self.written: dict[str, bytes] = {}

    @property
    def call_key(self) -> str:
        """The call's stable key (``CALL_KEY``), under the session's namespace."""
        key = self.ctx.call_key
        return f"{self.namespace}/{key}" if self.namespace else key

    def argv(self) -> list[str]:
        assert isinstance(self.args, BashArgs)
        argv = ["bash", "-c", self.args.command]
        if self.args.timeout is not None:
            # The limit lives in the Space with the command (coreutils ``timeout``), so a
            # reattached or replayed command keeps it, and it holds with no driver alive.
            argv = ["timeout", "-k", "5", f"{self.args.timeout:g}", *argv]
        return argv

    async def command(
        self, space: Space, key: str, epoch: int, *, new_key: bool = False
    ) -> ExecResult:
        """Run (or reattach to, or replay) the call's command under ``key``; ``new_key``:
        a start mark just made it (``Space.spawn``)."""
        execution = await space.spawn(
            self.argv(),
            key=key,
            epoch=epoch,
            cwd=self.cwd or space.root,
            env={CALL_KEY: self.call_key},
            keep_output=OUTPUT_KEEP_BYTES,
            new_key=new_key,
        )
        hit("adapter.spawn")
        # "running": the command is still going a moment after it started.
        running = asyncio.get_running_loop().call_later(RUNNING_MARK, _running_mark)
        try:
            async for chunk in execution.output():
                self._forward(chunk)
            res = await execution.wait()
        finally:
            running.cancel()
        hit("adapter.exit")
        return res

    def _forward(self, chunk: bytes) -> None:
        """Live output, unless the fence says a newer driver exists (checked <= 5/s), and
        at most ``OUTPUT_KEEP_BYTES`` of it (the harness commits what it streams)."""
        if self._streamed >= OUTPUT_KEEP_BYTES:
            return
        chunk = chunk[: OUTPUT_KEEP_BYTES - self._streamed]
        self._streamed += len(chunk)
        now = time.monotonic()
        if self.fence is not None and now - self._fence_checked >= STREAM_FENCE_INTERVAL:
            self._fence_checked = now
            try:
                self.fence.check()
                self._fence_ok = True
            except StaleEpochError:
                self._fence_ok = False
        if self._fence_ok:
            self.ctx.output(chunk.decode(errors="replace"))
            if self._streamed >= OUTPUT_KEEP_BYTES:
                self.ctx.output("\n[live output stops here; the result keeps its end]\n")

    async def file_op(self, space: Space, epoch: int) -> dict[str, Any]:
        """The write or edit, as an outcome."""
        hit("adapter.before_file_op")  # a driver paused here must never write after a takeover
        if isinstance(self.args, WriteArgs):
            path, data = self.args.path, self.args.content.encode()
            await space.write_file(path, data, epoch=epoch)
            self.written[hashlib.sha256(data).hexdigest()] = data
            return {"status": "ok", "content": f"wrote {len(data)} bytes to {path}"}
        assert isinstance(self.args, EditArgs)
        path = self.args.path
        st = await space.stat(path)
        if st is None or st.kind != "file":
            return {"status": "error", "content": f"edit: {path} does not exist"}
        # Bytes in, bytes out: a file that is not UTF-8 keeps every byte the edit does not
        # replace (decoding it with replacement characters would corrupt them).
        data = await space.read_file(path)
        old, new = self.args.old_text.encode(), self.args.new_text.encode()
        count = data.count(old)
        if count != 1:
            why = "not found" if count == 0 else f"found {count} times"
            return {"status": "error", "content": f"edit: old_text {why} in {path}"}
        edited = data.replace(old, new, 1)
        await space.write_file(path, edited, st.mode, epoch=epoch)
        self.written[hashlib.sha256(edited).hexdigest()] = edited
        return {"status": "ok", "content": f"edited {path}"}

    def outcome(self, res: ExecResult) -> dict[str, Any]:
        return bash_outcome(res, self.args.timeout if isinstance(self.args, BashArgs) else None)


def _running_mark() -> None:
    # From a timer: whether these are hit depends on how long the command ran, so they
    # are not logical positions of the run (see chaos/failpoints.py).
    hit("adapter.running", timer=True)
    hit("adapter.mid_call", timer=True)  # the effect may have happened, not recorded


def bash_outcome(res: ExecResult, timeout: float | None = None) -> dict[str, Any]:
    """The recorded outcome of a wrapped command (its output already bounded)."""
    text = res.output.decode(errors="replace")
    code = res.exit_code
    status = "ok" if code == 0 else "error"
    if timeout is not None and code in (TIMED_OUT, 128 + 9):
        tail = f"\n[killed: timed out after {timeout:g} s]"
    elif code is not None:
        tail = f"\n[exit code {code}]"
    else:
        tail = f"\n[killed by signal {res.signal}]"
    outcome: dict[str, Any] = {
        "status": status,
        "content": (text + tail).lstrip("\n"),
        "exit_code": code,
    }
    if res.omitted:
        outcome["output_omitted_bytes"] = res.omitted
    return outcome
