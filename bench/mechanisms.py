"""Does each speed mechanism earn its keep? One A/B per mechanism, in one run.

    python -m bench.mechanisms [--only NAME,...] [--reps N] [--campaign-reps N]

A mechanism stays only if it saves at least 5 % of the call or the campaign it serves
(``docs/mechanisms.md``). Each one is measured against itself switched off, in the same
process (a call) or the same run of this bench (a campaign), the two sides interleaved
(their order swapped every repetition, so drift hits both alike); the saving is the
median of each repetition's own.

Calls: two conversations of one ``durable_spaces`` adapter on the same backend, each on a
Space holding the same tree (``bench.peers``), one with the mechanism on and one with it
off; a wrapped ``bash`` call that changes ten files (or, where the mechanism serves
writes, a ``write`` of one small file) is timed from the tool's ``execute``
through the harness's commit of its result (what a mechanism moves from the call to its
result's commit is counted), then the model's turn (``--think`` ms, as ``bench.adapter``)
lets what a call leaves for later run outside the timed calls. Campaigns:
``durable-spaces campaign --backend local`` in a subprocess, all switches on against one
switched off, the same seeds.

It prints one line per mechanism (fields only ever appended)::

    MECH name=<m> serves=<what> on_ms=<median> off_ms=<median> saving_pct=<p> n=<reps>

``saving_pct`` is the median over repetitions of ``(off - on) / off * 100``.
    SKIP name=<m> reason=<why>
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

from bench.adapter import Setup, setup
from bench.peers import change_command, tree_tar
from durable_spaces.backends import open_backend, unavailable_reason
from durable_spaces.space import SpaceBackend, space_name

#: A switch's on or off state, entered around each call of its side.
Toggle = Callable[[bool], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def env(name: str, on: bool) -> Iterator[None]:
    """``name`` set to 1 or 0 while a call of this side runs (and its model's turn)."""
    before = os.environ.get(name)
    os.environ[name] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def env_toggle(name: str) -> Toggle:
    return lambda on: env(name, on)


@dataclass(frozen=True)
class CallAB:
    """One mechanism measured on a wrapped call."""

    name: str
    serves: str
    backend: str
    mode: str
    files: int
    toggle: Toggle
    #: Why it cannot be measured here (None: it can).
    unavailable: Callable[[], str | None] = lambda: None
    #: Run only when named in ``--only`` (a call that takes seconds: minutes in all).
    opt_in: bool = False
    #: The wrapped call timed: ``bash`` (ten files changed) or ``write`` (one small file).
    tool: str = "bash"


@dataclass(frozen=True)
class CampaignAB:
    """One mechanism measured on a campaign (its switch, off on one side)."""

    name: str
    serves: str
    switch: str


def _procmap_query() -> Toggle:
    from durable_spaces.host import maps

    @contextlib.contextmanager
    def toggle(on: bool) -> Iterator[None]:
        before = maps.use_query
        maps.use_query = on and before
        try:
            yield
        finally:
            maps.use_query = before

    return toggle


def _procmap_unavailable() -> str | None:
    from durable_spaces.host import maps

    return None if maps.use_query else "this kernel has no PROCMAP_QUERY"


@contextlib.contextmanager
def _both(
    a: contextlib.AbstractContextManager[None], b: contextlib.AbstractContextManager[None]
) -> Iterator[None]:
    with a, b:
        yield


def _inode_pool() -> Toggle:
    from durable_spaces.adapter.checkpoints.inode_pool import POOL

    @contextlib.contextmanager
    def toggle(on: bool) -> Iterator[None]:
        with env("DS_INODE_POOL", on):
            if on:
                yield
                return
            # Off: no file made ahead is taken either (the other side's pool).
            POOL.take = lambda dfd: None  # type: ignore[method-assign]
            try:
                yield
            finally:
                del POOL.take

    return toggle


def _carriers() -> Toggle:
    from durable_spaces.adapter.checkpoints import batch

    @contextlib.contextmanager
    def toggle(on: bool) -> Iterator[None]:
        if on:
            yield
            return
        init = batch.Batch.__init__

        def no_carry(self: batch.Batch, *a: object, **kw: object) -> None:
            init(self, *a, **kw)  # type: ignore[arg-type]
            self._carry_ok = False  # every blob synced on its own, as before carriers

        batch.Batch.__init__ = no_carry  # type: ignore[method-assign]
        try:
            yield
        finally:
            batch.Batch.__init__ = init  # type: ignore[method-assign]

    return toggle


def _ledger_marks() -> Toggle:
    from durable_spaces.adapter import log_witness

    @contextlib.contextmanager
    def toggle(on: bool) -> Iterator[None]:
        before = log_witness.use_marks
        log_witness.use_marks = on  # off: a ``true`` run under the position's key
        try:
            yield
        finally:
            log_witness.use_marks = before

    return toggle


def _host_look_spacesd() -> Toggle:
    from durable_spaces.backends.spacesd.namespaced_space import NamespacedSpace

    @contextlib.contextmanager
    def toggle(on: bool) -> Iterator[None]:
        if on:
            yield
            return
        # Off: the look for leftover processes is the command in the Space, as before.
        kept = NamespacedSpace.host_processes
        NamespacedSpace.host_processes = lambda self: None  # type: ignore[method-assign]
        try:
            yield
        finally:
            NamespacedSpace.host_processes = kept  # type: ignore[method-assign]

    return toggle


CALLS: tuple[CallAB, ...] = (
    CallAB(
        "inode-pool",
        "checkpoint call (local)",
        "local",
        "checkpoint",
        100,
        _inode_pool(),
    ),
    CallAB(
        "copy-behind",
        "checkpoint call (local)",
        "local",
        "checkpoint",
        100,
        env_toggle("DS_COPY_BEHIND"),
    ),
    CallAB("carriers", "checkpoint call (local)", "local", "checkpoint", 100, _carriers()),
    CallAB(
        "procmap-query",
        "checkpoint call (local; the holders look)",
        "local",
        "checkpoint",
        100,
        _procmap_query(),
        _procmap_unavailable,
    ),
    CallAB(
        "local-forkserver",
        "transactional call (local)",
        "local",
        "transactional",
        100,
        env_toggle("DS_LOCAL_FORKSERVER"),
    ),
    CallAB(
        "local-forkserver-cp",
        "checkpoint call (local)",
        "local",
        "checkpoint",
        100,
        env_toggle("DS_LOCAL_FORKSERVER"),
    ),
    CallAB(
        "ledger-marks",
        "transactional write call (local; the log witness's record)",
        "local",
        "transactional",
        100,
        _ledger_marks(),
        tool="write",
    ),
    CallAB(
        "host-look-spacesd",
        "transactional bash call (spacesd; the look for leftover processes)",
        "spacesd",
        "transactional",
        100,
        _host_look_spacesd(),
    ),
    CallAB(
        "inode-pool-spacesd",
        "checkpoint call (spacesd)",
        "spacesd",
        "checkpoint",
        100,
        _inode_pool(),
    ),
    CallAB(
        "copy-behind-spacesd",
        "checkpoint call (spacesd)",
        "spacesd",
        "checkpoint",
        100,
        env_toggle("DS_COPY_BEHIND"),
    ),
    CallAB(
        "carriers-spacesd", "checkpoint call (spacesd)", "spacesd", "checkpoint", 100, _carriers()
    ),
    CallAB(
        "host-journal-scan",
        "transactional call's scan (local, inotify journal)",
        "local",
        "transactional",
        1000,
        env_toggle("DS_SPACE_JOURNAL"),
    ),
    CallAB(
        "host-journal-checkpoint",
        "checkpoint call's walk (local, inotify journal)",
        "local",
        "checkpoint",
        1000,
        env_toggle("DS_SPACE_JOURNAL"),
    ),
    CallAB(
        "host-scan",
        "transactional call's scan (spacesd: host-side vs in the Space)",
        "spacesd",
        "transactional",
        1000,
        env_toggle("DS_HOST_SCAN"),
    ),
    CallAB(
        "in-space-journal",
        "transactional call's scan (spacesd, DS_HOST_SCAN=0)",
        "spacesd",
        "transactional",
        1000,
        lambda on: _both(env("DS_HOST_SCAN", False), env("DS_SPACE_JOURNAL", on)),
    ),
    CallAB(
        "in-space-journal-microvm",
        "transactional call's scan (microvm under TCG)",
        "microvm",
        "transactional",
        100,
        env_toggle("DS_SPACE_JOURNAL"),
        opt_in=True,
    ),
)


CAMPAIGNS: tuple[CampaignAB, ...] = (
    CampaignAB("warm-drivers", "campaign (local): each resume's driver", "DS_WARM_DRIVERS"),
    CampaignAB("zygote", "campaign (local): spares forked, not started", "DS_ZYGOTE"),
    CampaignAB("worker-spares", "campaign (local): each run's worker", "DS_WARM_WORKERS"),
    CampaignAB("fast-exit", "campaign (local): each process's end", "DS_FAST_EXIT"),
    CampaignAB("local-forkserver-campaign", "campaign (local)", "DS_LOCAL_FORKSERVER"),
)

ALL_SWITCHES = (
    "DS_SPACE_JOURNAL",
    "DS_HOST_SCAN",
    "DS_LOCAL_FORKSERVER",
    "DS_WARM_DRIVERS",
    "DS_WARM_WORKERS",
    "DS_FAST_EXIT",
    "DS_INODE_POOL",
    "DS_COPY_BEHIND",
    "DS_ZYGOTE",
)


def saving(on: float, off: float) -> float:
    return (off - on) / off * 100 if off > 0 else 0.0


def line(name: str, serves: str, on: list[float], off: list[float], unit: float) -> str:
    """The medians of each side, and the saving as the median of each repetition's own
    (its two sides ran back to back: a change of the machine's load between repetitions
    moves both)."""
    a, b = statistics.median(on) * unit, statistics.median(off) * unit
    pairs = statistics.median(saving(x, y) for x, y in zip(on, off, strict=True))
    return (
        f"MECH name={name} serves={serves.replace(' ', '_')} on_ms={a:.2f} off_ms={b:.2f} "
        f"saving_pct={pairs:.1f} n={len(on)}"
    )


async def _side(backend: SpaceBackend, tmp: Path, mode: str, tree: bytes, tag: str) -> Setup:
    plain = await backend.create(space_name(f"mech-plain-{tag}"))  # bench.adapter's twin
    await plain.advance_epoch(1)
    d = tmp / tag
    d.mkdir(parents=True)
    return await setup(backend, d, mode, tree, plain, None)


async def call_ab(ab: CallAB, base: Path, reps: int, think: float) -> str:
    if (why := unavailable_reason(ab.backend) or ab.unavailable()) is not None:
        return f"SKIP name={ab.name} reason={why.replace(' ', '_')}"
    tree = tree_tar(ab.files)
    times: dict[bool, list[float]] = {True: [], False: []}
    sides: dict[bool, Setup] = {}
    # One backend a side, opened inside its toggle: a backend and the adapter built on it
    # take their settings (durable_spaces/settings.py) when they are made, so a switch
    # the backend reads (the journals, the host scan, the fork server) is each side's own.
    backends: dict[bool, SpaceBackend] = {}
    try:
        for on in (True, False):
            with ab.toggle(on):
                backends[on] = open_backend(ab.backend, base / ab.name / f"spaces-{on:d}")
                sides[on] = await _side(backends[on], base / ab.name, ab.mode, tree, f"{on:d}")
        for i in range(reps + 1):  # the first pair warms both sides up: not counted
            order = (True, False) if i % 2 == 0 else (False, True)
            for on in order:
                s = sides[on]
                cmd = change_command(ab.files, i, f"mech-{i}-" + "x" * 40)
                args = (
                    {"command": cmd}
                    if ab.tool == "bash"
                    else {"path": f"mech-{i}.txt", "content": f"mech {i}\n"}
                )
                with ab.toggle(on):
                    t0 = time.perf_counter()
                    await s.wrapped(ab.tool, args)
                    took = time.perf_counter() - t0
                    await asyncio.sleep(think)
                if i:
                    times[on].append(took)
    finally:
        for s in sides.values():
            await s.harness.close()
            s.storage.close()
        for backend in backends.values():
            for name in await backend.names():
                await backend.delete(name)
            await backend.close()
    return line(ab.name, ab.serves, times[True], times[False], 1000)


def campaign_once(out: Path, env_over: dict[str, str], runs: int, calls: int) -> tuple[float, str]:
    """One campaign in a subprocess: its wall time, and its SUMMARY line."""
    e = {**os.environ, **env_over}
    cmd = [sys.executable, "-m", "durable_spaces.cli", "campaign", "--backend", "local"]
    cmd += ["--runs", str(runs), "--calls", str(calls), "--no-progress", "--no-report"]
    cmd += ["--seed-base", "mech", "--out", str(out), "--force"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    shutil.rmtree(out, ignore_errors=True)
    summary = next((x for x in p.stdout.splitlines() if x.startswith("SUMMARY")), "")
    if p.returncode != 0 or not summary:
        raise RuntimeError(f"campaign failed ({p.returncode}): {p.stderr[-500:]}")
    return took, summary


def resume_p50(summary: str) -> float | None:
    m = re.search(r"resume_p50_ms=([0-9.]+)", summary)
    return float(m.group(1)) if m else None


def campaign_abs(abs_: Sequence[CampaignAB], base: Path, reps: int, runs: int, calls: int) -> None:
    on_env = {s: "1" for s in ALL_SWITCHES}
    wall: dict[str, list[float]] = {"on": [], **{ab.name: [] for ab in abs_}}
    resume: dict[str, list[float]] = {k: [] for k in wall}
    for i in range(reps):
        sides = ["on", *(ab.name for ab in abs_)]
        if i % 2:
            sides.reverse()
        for side in sides:
            over = dict(on_env)
            for ab in abs_:
                if ab.name == side:
                    over[ab.switch] = "0"
            took, summary = campaign_once(base / f"c-{side}-{i}", over, runs, calls)
            wall[side].append(took)
            if (r := resume_p50(summary)) is not None:
                resume[side].append(r)
            print(f"# campaign {side} rep {i}: {took:.1f} s; {summary}", flush=True)
    for ab in abs_:
        print(line(ab.name, ab.serves, wall["on"], wall[ab.name], 1000), flush=True)
        if resume["on"] and resume[ab.name]:
            print(
                line(ab.name + "-resume", "resume_p50_of_" + ab.serves, resume["on"],
                     resume[ab.name], 1),
                flush=True,
            )  # fmt: skip


async def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.mechanisms", description=__doc__.split("\n")[0]
    )
    names = [ab.name for ab in CALLS] + [ab.name for ab in CAMPAIGNS]
    ap.add_argument(
        "--only",
        default=None,
        help="comma-separated names (default: all but in-space-journal-microvm): "
        + ",".join(names),
    )
    ap.add_argument("--reps", type=int, default=41, help="calls per side (default 41)")
    ap.add_argument("--campaign-reps", type=int, default=5, help="campaigns per side (default 5)")
    ap.add_argument("--runs", type=int, default=4, help="runs per campaign (default 4)")
    ap.add_argument("--calls", type=int, default=6, help="calls per run (default 6)")
    ap.add_argument("--think", type=float, default=20.0, help="ms between calls (default 20)")
    args = ap.parse_args(argv)
    opt_in = {ab.name for ab in CALLS if ab.opt_in}
    only = set(args.only.split(",")) if args.only else set(names) - opt_in
    if unknown := only - set(names):
        ap.error(f"--only: no mechanism {', '.join(sorted(unknown))}")
    if min(args.reps, args.campaign_reps, args.runs, args.calls) < 1:
        ap.error("--reps, --campaign-reps, --runs and --calls: at least 1")
    if not 0 <= args.think <= 60_000:  # NaN fails this too
        ap.error(f"--think {args.think:g}: milliseconds from 0 to 60000")
    base = Path(tempfile.mkdtemp(prefix="bench-mechanisms-"))
    t_start = time.monotonic()
    try:
        for ab in CALLS:
            if ab.name in only:
                print(await call_ab(ab, base, args.reps, args.think / 1000), flush=True)
        chosen = [ab for ab in CAMPAIGNS if ab.name in only]
        if chosen:
            campaign_abs(chosen, base, args.campaign_reps, args.runs, args.calls)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"# total {time.monotonic() - t_start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
