"""What a wrapped call costs over the same call unwrapped, and over the peers.

    python -m bench.adapter [--backends local,spacesd,docker[,microvm]] [--sizes 10,100,1000]
                            [--modes transactional,checkpoint] [--tools bash,write]
                            [--reps N] [--peer-reps N] [--think MS] [--quick]

Per (mode, backend, tool, workspace size) it times the *wrapped* tool's ``execute`` (the
tool the adapter's extension installs in a real ``Registry``, called with a real
``ToolContext`` of a real ``Harness`` on a SQLite log, synchronous=NORMAL) against the
*unwrapped* call on its own Space holding an identical tree (``bench.peers``), so the
unwrapped call's changes never fall into the wrapped call's scans or checkpoints:
``bash`` appends a line to ten files of the tree (a different ten per call), unwrapped
``space.exec(..., key=None)`` of the same command; ``write`` writes one small file,
unwrapped ``space.write_file``. The two take turns, call by call, so drift hits both
alike; the figures are medians. After each call it pauses ``--think`` ms (20 by default;
0: back to back), as the model's turn would: what a wrapped call leaves running after its
result (its Space copy's write, the store's files made ahead) runs there, not in the next
timed call, which half the time is the unwrapped twin's. The harness's own commits around
a tool (task running, result entry) are not counted: a tool pays them wrapped or not.

Checkpoint mode keeps workspace checkpoints in a ``DirectoryCheckpointStore`` (machine
checkpoints on microvm, as auto mode would use them). Transactional mode runs with
``max_files`` raised to 1100 so that 1000 files plus the tool's own fit. It prints, one
line each (``RATIO`` and ``PEER`` are the forms docs/performance.md reads; fields only ever
appended)::

    RATIO wrapped/unwrapped mode=<m> backend=<b> tool=<t> files=<n> changed=<k> wrapped_ms=<x> unwrapped_ms=<y> x=<ratio> result_commit_ms=<z>
    PEER name=<p> files=<n> ms=<x> backend=<b>
    OVERHEAD mode=<m> backend=<b> tool=<t> files=<n> overhead_ms=<x> tar_ms=<y> git_ms=<z> below_tar=<yes|no> below_git=<yes|no>
    BYTES mode=<m> backend=<b> tool=<t> files=<n> log_per_call=<bytes> store_per_call=<bytes>
    SKIP backend=<b> [peer=<p>] reason=<why>
    PHASES mode=<m> backend=<b> tool=<t> files=<n> call_ms=<x> ...   (--phases: bench.phases)

``result_commit_ms`` is the harness's commit of the wrapped call's result, which the
bench makes after each call as the harness would (untimed in ``wrapped_ms``: a tool pays
it wrapped or not), with what the adapter adds to it (in checkpoint mode, the
checkpoint's record).

``OVERHEAD`` is the adapter's per-call cost (wrapped - unwrapped) beside the peers of the
same tree on the same backend; ``BYTES`` what each wrapped call added to the log (JSON
ops) and to the checkpoint store.
"""  # noqa: E501

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

from bench.peers import CHANGED, change_command, peers, populate, tree_tar
from bench.phases import Phases
from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    SandboxSnapshots,
    Snapshots,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
from durable_spaces.adapter.image import ImageLimits
from durable_spaces.backends import open_backend, unavailable_reason
from durable_spaces.harness.log import Commit, LogOp, SqliteStorage
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tool_tasks import record_result
from durable_spaces.harness.tools import CodingTools, Registry, ToolContext
from durable_spaces.space import Space, SpaceBackend, space_name

TOOLS = ("bash", "write")
#: Backends benched only when named (``--backends``), and why.
OPT_IN = {"microvm": "not named in --backends (a call takes seconds under TCG: minutes)"}
#: ``--quick``: calls per tool and runs per peer.
QUICK_REPS, QUICK_PEER_REPS = 5, 3
#: The pause after each timed call (``--think``): an agent's tool calls have the model's
#: turn between them, where the work a wrapped call leaves for after its result runs.
THINK_MS = 20.0
#: Backends whose every exec costs tens of ms: fewer repetitions.
SLOW = ("docker", "microvm")


def default_reps(backend: str, size: int) -> int:
    """Runs of each peer (a peer walks the whole tree: fewer at 1000 files)."""
    n = 21 if size <= 10 else 15 if size <= 100 else 9
    return max(3, n // 3) if backend in SLOW else n


def call_reps(backend: str) -> int:
    """Wrapped and unwrapped calls per tool: a call changes ten files whatever the
    tree's size, so as many at 1000 files as at 10 (with 9, the median of one run moved
    30% from the next one's here)."""
    return 9 if backend in SLOW else 31


class CountingStorage:
    """A SqliteStorage that also sums the JSON bytes of the ops it appends (counted when
    ``total`` is read, between the timed calls: encoding them again inside a call would
    add to the wrapped figure what the adapter does not spend)."""

    def __init__(self, inner: SqliteStorage) -> None:
        self.inner = inner
        self._counted = 0
        self._pending: list[Sequence[LogOp]] = []

    @property
    def total(self) -> int:
        for ops in self._pending:
            self._counted += sum(len(json.dumps(op, separators=(",", ":"))) for op in ops)
        self._pending.clear()
        return self._counted

    @property
    def identity(self) -> str:
        return self.inner.identity

    def load(self) -> list[Commit]:
        return self.inner.load()

    def append(self, ops: Sequence[LogOp]) -> int:
        seq = self.inner.append(ops)
        self._pending.append(ops)  # committed ops are never changed afterwards
        return seq

    def close(self) -> None:
        self.inner.close()


@dataclass
class Figures:
    mode: str
    backend: str
    tool: str
    files: int
    changed: int
    wrapped: list[float] = field(default_factory=list)
    plain: list[float] = field(default_factory=list)
    result: list[float] = field(default_factory=list)  # each wrapped call's result commit
    log_per_call: int = 0
    store_per_call: int = 0

    @property
    def wrapped_ms(self) -> float:
        return statistics.median(self.wrapped) * 1000

    @property
    def unwrapped_ms(self) -> float:
        return statistics.median(self.plain) * 1000

    def ratio_line(self) -> str:
        commit = self.result and f" result_commit_ms={1000 * statistics.median(self.result):.2f}"
        return (
            f"RATIO wrapped/unwrapped mode={self.mode} backend={self.backend} "
            f"tool={self.tool} files={self.files} changed={self.changed} "
            f"wrapped_ms={self.wrapped_ms:.2f} unwrapped_ms={self.unwrapped_ms:.2f} "
            f"x={self.wrapped_ms / self.unwrapped_ms:.2f}" + (commit or "")
        )


@dataclass
class Setup:
    harness: Harness
    storage: CountingStorage
    durable: DurableSpaces
    registry: Registry
    conv: str
    space: Space  # the wrapped calls' Space
    plain: Space  # the unwrapped calls' own Space, an identical tree
    store: Path
    phases: Phases | None = None
    calls: int = 0
    #: Each wrapped call's result commit (not in its figure: see ``wrapped``).
    result_s: list[float] = field(default_factory=list)

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
        if self.phases is None:
            res = await t.execute(args, ctx)
        else:
            with self.phases.call():
                res = await t.execute(args, ctx)
        if res.status != "ok":
            raise RuntimeError(f"wrapped {tool} failed: {res.content}")
        # The result's commit, untimed as the harness's own (a tool pays it wrapped or
        # not), with what the adapter adds to it: the call's record, its checkpoint.
        t0 = time.perf_counter()
        await record_result(self.harness, ctx, res)
        self.result_s.append(time.perf_counter() - t0)

    def store_bytes(self) -> int:
        if not self.store.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.store.rglob("*") if p.is_file())


async def setup(
    backend: SpaceBackend, tmp: Path, mode: str, tree: bytes, plain: Space, phases: Phases | None
) -> Setup:
    store = tmp / "store"
    storage = CountingStorage(SqliteStorage(tmp / "log.sqlite"))
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
    await populate(space, tree, durable.epoch_for(space.name))
    s = Setup(harness, storage, durable, registry, conv, space, plain, store, phases)
    await s.wrapped("bash", {"command": "printf 'start\\n' >> journal.txt"})  # warm-up
    s.space = await durable.space(conv)
    return s


def calls_for(
    s: Setup, tool: str, files: int, i: int
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]], int]:
    """The wrapped call, its unwrapped twin, and how many files each changes."""
    tag = f"{tool}-{i}-" + "x" * 40
    if tool == "write":
        content = (tag + "\n") * 8

        async def wrapped() -> None:
            await s.wrapped("write", {"path": "notes/small.txt", "content": content})

        async def plain() -> None:
            await s.plain.write_file("notes/small.txt", content.encode(), epoch=1)

        return wrapped, plain, 1
    cmd = change_command(files, i, tag)

    async def wrapped_bash() -> None:
        await s.wrapped("bash", {"command": cmd})

    async def plain_bash() -> None:
        r = await s.plain.exec(["bash", "-c", cmd], key=None, epoch=1, cwd=s.plain.root)
        assert r.exit_code == 0, r.output

    return wrapped_bash, plain_bash, min(CHANGED, files)


async def bench_mode(
    name: str,
    backend: SpaceBackend,
    tmp: Path,
    mode: str,
    files: int,
    tree: bytes,
    tools: Sequence[str],
    reps: int,
    phases: Phases | None = None,
    think: float = 0.0,
) -> list[Figures]:
    plain = await backend.create(space_name(f"bench-plain-{tmp.name}"))
    await plain.advance_epoch(1)
    await populate(plain, tree, 1)
    s = await setup(backend, tmp, mode, tree, plain, phases)
    out = []
    try:
        for tool in tools:
            log0, store0 = s.storage.total, s.store_bytes()
            if phases is not None:
                phases.reset()
            fig: Figures | None = None
            for i in range(reps):
                wrapped, unwrapped, k = calls_for(s, tool, files, i)
                fig = fig or Figures(mode, name, tool, files, k)
                pairs = [(wrapped, fig.wrapped), (unwrapped, fig.plain)]
                for fn, xs in pairs if i % 2 == 0 else pairs[::-1]:
                    t0 = time.perf_counter()
                    await fn()
                    xs.append(time.perf_counter() - t0)
                    # The model's turn: what a call leaves running after its result
                    # (its copy's write, files made ahead) runs here, as in a session,
                    # not in the next timed call (the unwrapped twin's, half the time).
                    await asyncio.sleep(think)
            assert fig is not None
            fig.result = s.result_s[-reps:]
            fig.log_per_call = (s.storage.total - log0) // reps
            fig.store_per_call = (s.store_bytes() - store0) // reps
            print(fig.ratio_line(), flush=True)
            if phases is not None:
                print(phases.line(mode, name, tool, files), flush=True)
            out.append(fig)
    finally:
        await s.harness.close()
        s.storage.close()
    return out


def _cmp(over: float, peer: float | str | None) -> tuple[str, str]:
    if isinstance(peer, float):
        return f"{peer:.2f}", "yes" if over < peer else "no"
    return "na", "na"


def overhead_lines(figs: list[Figures], peer: dict[int, dict[str, float | str]]) -> list[str]:
    lines = []
    for f in figs:
        p = peer.get(f.files, {})
        over = f.wrapped_ms - f.unwrapped_ms
        tar, git = p.get("tar-cf"), p.get("git-commit")

        (tar_ms, below_tar), (git_ms, below_git) = _cmp(over, tar), _cmp(over, git)
        lines.append(
            f"OVERHEAD mode={f.mode} backend={f.backend} tool={f.tool} files={f.files} "
            f"overhead_ms={over:.2f} tar_ms={tar_ms} git_ms={git_ms} "
            f"below_tar={below_tar} below_git={below_git}"
        )
        lines.append(
            f"BYTES mode={f.mode} backend={f.backend} tool={f.tool} files={f.files} "
            f"log_per_call={f.log_per_call} store_per_call={f.store_per_call}"
        )
    return lines


async def bench_backend(name: str, base: Path, args: argparse.Namespace) -> list[Figures]:
    backend = open_backend(name, base / name / "spaces")
    phases = None
    if args.phases:
        phases = Phases()
        phases.install()
    figs: list[Figures] = []
    peer: dict[int, dict[str, float | str]] = {}
    try:
        for files in (int(x) for x in args.sizes.split(",")):
            tree = tree_tar(files)
            t0 = time.monotonic()
            ps = await backend.create(space_name(f"bench-peers-{files}"))
            await ps.advance_epoch(1)
            await populate(ps, tree, 1)
            peer[files] = await peers(ps, files, args.peer_reps or default_reps(name, files), 1)
            await backend.delete(ps.name)
            for p, ms in peer[files].items():
                if isinstance(ms, float):
                    print(f"PEER name={p} files={files} ms={ms:.2f} backend={name}", flush=True)
                else:
                    print(f"SKIP backend={name} peer={p} files={files} reason={ms}", flush=True)
            for mode in args.modes.split(","):
                tmp = base / name / f"{mode}-{files}"
                tmp.mkdir(parents=True)
                reps = args.reps or call_reps(name)
                figs += await bench_mode(
                    name,
                    backend,
                    tmp,
                    mode,
                    files,
                    tree,
                    args.tools.split(","),
                    reps,
                    phases,
                    args.think / 1000,
                )
            print(f"# {name} {files} files: {time.monotonic() - t0:.1f} s", flush=True)
        for line in overhead_lines(figs, peer):
            print(line, flush=True)
    finally:
        for sp_name in await backend.names():  # stop every daemon we started
            await backend.delete(sp_name)
        await backend.close()
        if phases is not None:
            phases.uninstall()
    return figs


async def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.adapter", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--backends",
        default=None,
        help="default: local,spacesd,docker (microvm only when named: minutes under TCG)",
    )
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--modes", default="transactional,checkpoint")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument(
        "--reps", type=int, default=None, help="calls per tool (default 31; 9 on docker, microvm)"
    )
    ap.add_argument("--peer-reps", type=int, default=None, help="runs per peer")
    ap.add_argument(
        "--think",
        type=float,
        default=THINK_MS,
        help=f"ms between calls, the model's turn (default {THINK_MS:g}; 0: back to back)",
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="also time the parts of each wrapped call (bench.phases): PHASES lines",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="local and spacesd only (unless --backends), 5 calls per tool, 3 runs per peer",
    )
    args = ap.parse_args(argv)
    if not 0 <= args.think <= 60_000:  # NaN fails this too; inf would never wake
        ap.error(f"--think {args.think:g}: milliseconds from 0 to 60000")
    if args.backends is None:
        args.backends = "local,spacesd" if args.quick else "local,spacesd,docker"
        for name in ("docker", "microvm"):
            if name not in args.backends:
                why = OPT_IN.get(name, "--quick (name it in --backends)")
                print(f"SKIP backend={name} reason={why}", flush=True)
    if args.quick:
        args.reps = args.reps or QUICK_REPS
        args.peer_reps = args.peer_reps or QUICK_PEER_REPS
    base = Path(tempfile.mkdtemp(prefix="bench-adapter-"))
    t_start = time.monotonic()
    try:
        for name in args.backends.split(","):
            if (reason := unavailable_reason(name)) is not None:
                print(f"SKIP backend={name} reason={reason}", flush=True)
                continue
            await bench_backend(name, base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"# total {time.monotonic() - t_start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
