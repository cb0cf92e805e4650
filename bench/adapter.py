"""What a wrapped call costs over the same operation unwrapped, on the same Space.

    python -m bench.adapter [--backends local,spacesd] [--sizes 10,100,1000]
                            [--modes transactional,checkpoint] [--reps N] [--changed K]

Per (backend, mode, workspace size, tool) it times the *wrapped* tool's ``execute`` (the
tool the adapter's extension installs in a real ``Registry``, called with a real
``ToolContext`` of a real ``Harness`` on a SQLite log, synchronous=NORMAL) against the
*unwrapped* operation on the same Space: ``space.write_file`` for ``write``, and
``space.exec(..., key=None)`` for ``bash`` (``printf ... >> journal.txt``). The two take
turns, call by call, so drift hits both alike. The harness's own commits around a tool
(task running, result entry) are not counted: a tool pays them wrapped or not.

The workspace holds N files of 4 KiB of random bytes (in 10 subdirectories) written
before the first call; a warm-up wrapped call absorbs the first image/checkpoint. Log
bytes per call are the JSON ops the adapter appended (what the log stores), split into
blobs, the image's path table and the ``cua.space`` document; checkpoint bytes per call
are the tar each call stores (in the ``CheckpointStore``, and once more in the Space).
Transactional mode runs with ``max_files`` raised to 1100 so that 1000 files plus the
journal fit (the default limit is 1000).

``--changed K``: ``bash`` appends a line to K of the N files instead, and the unwrapped
operations run on a twin Space populated the same way (their changes never fall into the
wrapped call's scans); each row is also printed as one ``RATIO`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

from rich.console import Console
from rich.table import Table

from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
from durable_spaces.adapter.image import ImageLimits
from durable_spaces.adapter.snapshots import (
    DirectoryCheckpointStore,
    SandboxSnapshots,
    Snapshots,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.state import BLOB_DOC_PREFIX, DOC, IMAGE_DOC
from durable_spaces.backends import open_backend, unavailable_reason
from durable_spaces.harness.log import Commit, Op, SqliteStorage
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry, ToolContext
from durable_spaces.space import Space, SpaceBackend

FILE_SIZE = 4096
TOOLS = ("write", "bash")


def default_reps(size: int) -> int:
    return 25 if size <= 10 else 15 if size <= 100 else 6


class CountingStorage:
    """A SqliteStorage that also sums the JSON bytes of the ops it appends, by kind."""

    def __init__(self, inner: SqliteStorage) -> None:
        self.inner = inner
        self.bytes: dict[str, int] = {}

    def load(self) -> list[Commit]:
        return self.inner.load()

    def append(self, ops: Sequence[Op]) -> int:
        for op in ops:
            n = len(json.dumps(op, separators=(",", ":")))
            name = str(op.get("name", ""))
            kind = (
                "blobs"
                if name.startswith(BLOB_DOC_PREFIX)
                else "table"
                if name == IMAGE_DOC
                else "state"
                if name == DOC
                else "other"
            )
            self.bytes[kind] = self.bytes.get(kind, 0) + n
        return self.inner.append(ops)

    def close(self) -> None:
        self.inner.close()

    def total(self) -> int:
        return sum(self.bytes.values())

    def file_bytes(self) -> int:
        """Size of the SQLite file with its WAL folded in (what the log takes on disk)."""
        self.inner._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return self.inner.path.stat().st_size


@dataclass
class Figures:
    backend: str
    mode: str
    size: int
    tool: str
    wrapped: list[float] = field(default_factory=list)
    plain: list[float] = field(default_factory=list)
    log_bytes: dict[str, int] = field(default_factory=dict)  # per call, by kind
    checkpoint_bytes: int = 0  # per call (tar)
    calls_in_doc: int = 0  # calls the cua.space document lists after the last one
    db_bytes: int = 0  # growth of the SQLite file per call
    changed: int = 1  # files one call changes

    def ratio_line(self) -> str:
        w, p = statistics.median(self.wrapped) * 1000, statistics.median(self.plain) * 1000
        return (
            f"RATIO wrapped/unwrapped mode={self.mode} backend={self.backend} tool={self.tool} "
            f"files={self.size} changed={self.changed if self.tool == 'bash' else 1} "
            f"wrapped_ms={w:.1f} unwrapped_ms={p:.1f} x={w / p:.2f}"
        )

    @property
    def ratio(self) -> float:
        return statistics.median(self.wrapped) / statistics.median(self.plain)


@dataclass
class Setup:
    harness: Harness
    storage: CountingStorage
    durable: DurableSpaces
    registry: Registry
    conv: str
    space: Space
    store: Path
    calls: int = 0

    async def wrapped(self, tool: str, args: dict[str, Any]) -> None:
        self.calls += 1
        t = self.registry.get(tool)
        assert t is not None
        ctx = ToolContext(
            harness=self.harness,
            conversation_id=self.conv,
            call_id=f"bench-{self.calls}",
            tool_name=tool,
            task_id=f"bench-{self.calls}",
            attempt=1,
            resumed=False,
            env=await self.harness.env(self.conv),
        )
        res = await t.execute(args, ctx)
        if res.status != "ok":
            raise RuntimeError(f"wrapped {tool} failed: {res.content}")

    def store_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.store.glob("*.tar"))


async def populate(space: Space, size: int, epoch: int) -> None:
    script = (
        f"mkdir -p {' '.join(f'src/d{i}' for i in range(10))} && "
        f"head -c {size * FILE_SIZE} /dev/urandom | split -b {FILE_SIZE} -a 4 - src/f && "
        "i=0; for f in src/f*; do mv $f src/d$((i % 10))/; i=$((i+1)); done"
    )
    res = await space.exec(["bash", "-c", script], key=None, epoch=epoch, cwd=space.root)
    if res.exit_code != 0:
        raise RuntimeError(f"populating the workspace failed: {res.output!r}")


async def some_files(space: Space, k: int) -> list[str]:
    """K of the populated files, spread over the subdirectories (the same names on a twin)."""
    dirs = [sorted(await space.list_dir(f"src/d{i}")) for i in range(10)]
    picked = [f"src/d{i % 10}/{dirs[i % 10][i // 10]}" for i in range(k)]
    return picked


async def setup(backend: SpaceBackend, tmp: Path, mode: str, size: int) -> Setup:
    store = tmp / "store"
    storage = CountingStorage(SqliteStorage(tmp / "log.sqlite"))
    # A backend that checkpoints whole machines (microvm) is measured with those, as auto
    # mode would use them; the others with workspace tars kept in a store.
    snapshots: Snapshots = (
        SandboxSnapshots(backend)
        if callable(getattr(backend, "checkpoint", None))
        else WorkspaceSnapshots(backend, store=DirectoryCheckpointStore(store))
    )
    durable = durable_spaces(
        backend,
        snapshots=snapshots,
        mode=mode,  # type: ignore[arg-type]
        epoch=1,
        transactional=ImageLimits(max_files=1100),
        namespace=f"bench-{tmp.name}",
    )
    registry = Registry().install(CodingTools).install(durable.extension)
    harness = await Harness.open(storage, models={}, registry=registry, env=durable.env)
    conv = (await harness.root(AgentConfig(model="none"))).id
    space = await durable.space(conv)
    await populate(space, size, durable.epoch_for(space.name))
    s = Setup(harness, storage, durable, registry, conv, space, store)
    await s.wrapped("bash", {"command": "printf 'start\\n' >> journal.txt"})  # warm-up
    s.space = await durable.space(conv)
    return s


async def bench_one(
    backend_name: str,
    backend: SpaceBackend,
    tmp: Path,
    mode: str,
    size: int,
    reps: int,
    changed: int = 0,
) -> list[Figures]:
    s = await setup(backend, tmp, mode, size)
    epoch = s.durable.epoch_for(s.space.name)
    twin = s.space
    if changed:
        twin = await backend.create(f"twin-{mode}-{size}")
        await populate(twin, size, epoch)
        # The twin's names match the wrapped Space's: split names its files the same way.
        targets = await some_files(s.space, changed)
    root = twin.root
    out = []
    try:
        for tool in TOOLS:
            fig = Figures(backend_name, mode, size, tool, changed=changed or 1)
            log0, by0, tar0 = s.storage.total(), dict(s.storage.bytes), s.store_bytes()
            db0 = s.storage.file_bytes()
            for i in range(reps):
                line = f"{tool}-{i}-" + "x" * 40
                if tool == "write":
                    content = (line + "\n") * 8

                    async def wrapped(c: str = content) -> None:
                        await s.wrapped("write", {"path": "notes/small.txt", "content": c})

                    async def plain(c: str = content) -> None:
                        await twin.write_file("notes/plain.txt", c.encode(), epoch=1)
                else:
                    cmd = f"printf '%s\\n' '{line}' >> journal.txt"
                    if changed:
                        files = " ".join(targets)
                        cmd = f"for f in {files}; do printf '%s\\n' '{line}' >> $f; done"

                    async def wrapped(c: str = cmd) -> None:
                        await s.wrapped("bash", {"command": c})

                    async def plain(c: str = cmd) -> None:
                        r = await twin.exec(
                            ["bash", "-c", c if changed else c.replace("journal", "plain")],
                            key=None,
                            epoch=epoch,
                            cwd=root,
                        )
                        assert r.exit_code == 0

                pairs: list[tuple[Callable[[], Awaitable[None]], list[float]]] = [
                    (wrapped, fig.wrapped),
                    (plain, fig.plain),
                ]
                for fn, xs in pairs if i % 2 == 0 else pairs[::-1]:
                    t0 = time.perf_counter()
                    await fn()
                    xs.append(time.perf_counter() - t0)
            # Bytes of the plain calls are none: only the wrapped calls append to the log.
            fig.log_bytes = {k: (v - by0.get(k, 0)) // reps for k, v in s.storage.bytes.items()}
            fig.log_bytes["total"] = (s.storage.total() - log0) // reps
            fig.checkpoint_bytes = (s.store_bytes() - tar0) // reps
            fig.calls_in_doc = s.calls
            fig.db_bytes = (s.storage.file_bytes() - db0) // reps
            out.append(fig)
    finally:
        await s.harness.close()
        s.storage.close()
    return out


def _kb(n: int) -> str:
    return f"{n / 1024:.1f}" if n else "-"


def report(figs: list[Figures], console: Console) -> None:
    t = Table(title="wrapped call vs the same operation unwrapped: median ms (min)")
    cols = ["backend", "mode", "files", "tool", "n", "wrapped", "plain", "ratio"]
    cols += ["log KiB", "db KiB", "blobs", "table", "state", "calls", "tar KiB"]
    for col in cols:
        left = col in ("backend", "mode", "tool")
        t.add_column(col, justify="left" if left else "right", no_wrap=True)
    for f in figs:
        lb = f.log_bytes
        t.add_row(
            f.backend,
            f.mode,
            str(f.size),
            f.tool,
            str(len(f.wrapped)),
            f"{statistics.median(f.wrapped) * 1000:.1f} ({min(f.wrapped) * 1000:.1f})",
            f"{statistics.median(f.plain) * 1000:.2f} ({min(f.plain) * 1000:.2f})",
            f"{f.ratio:.0f}x",
            _kb(lb.get("total", 0)),
            _kb(f.db_bytes),
            _kb(lb.get("blobs", 0)),
            _kb(lb.get("table", 0)),
            _kb(lb.get("state", 0)),
            str(f.calls_in_doc),
            _kb(f.checkpoint_bytes),
        )
    console.print(t)
    console.print(
        "ratio: median wrapped / median plain. The machine is shared: compare medians "
        "with mins before reading much into one row.\n"
        "per call: log KiB: JSON ops the adapter appended per wrapped call (blobs: new file "
        "contents, base64; table: the image's whole path table, rewritten per change; "
        "state: the cua.space document, rewritten whole at each of a call's commits, listing "
        "every call so far: 'calls' of them after the last one). db KiB: growth of "
        "the SQLite file (WAL folded in). tar KiB: "
        "the checkpoint stored per call (kept in the store and again inside the Space)."
    )


async def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.adapter", description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="local")
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--modes", default="transactional,checkpoint")
    ap.add_argument("--reps", type=int, default=None, help="calls per tool (default by size)")
    ap.add_argument(
        "--changed", type=int, default=0, help="files a bash call changes (unwrapped on a twin)"
    )
    args = ap.parse_args(argv)
    console = Console(width=max(Console().width, 160))
    figs: list[Figures] = []
    base = Path(tempfile.mkdtemp(prefix="bench-adapter-"))
    t_start = time.monotonic()
    try:
        for name in args.backends.split(","):
            if (why := unavailable_reason(name)) is not None:
                console.print(f"[yellow]skipping backend {name}: {why}[/]")
                continue
            backend = open_backend(name, base / name / "spaces")
            try:
                for mode in args.modes.split(","):
                    for size in (int(x) for x in args.sizes.split(",")):
                        tmp = base / name / f"{mode}-{size}"
                        tmp.mkdir(parents=True)
                        t0 = time.monotonic()
                        reps = args.reps or default_reps(size)
                        figs += await bench_one(
                            name, backend, tmp, mode, size, reps, min(args.changed, size)
                        )
                        console.print(
                            f"{name} {mode} {size} files: {time.monotonic() - t0:.1f} s",
                            style="dim",
                        )
            finally:
                for sp_name in await backend.names():  # stop every daemon we started
                    await backend.delete(sp_name)
                await backend.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(figs, console)
    if args.changed:
        for f in figs:
            print(f.ratio_line())
    console.print(f"total {time.monotonic() - t_start:.1f} s", style="dim")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
