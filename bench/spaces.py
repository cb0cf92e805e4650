"""Spaces across backends (``python -m bench.spaces [--backends local,spacesd]``).

Per backend: the round trip of a trivial exec (``true``, with and without a key) against
a plain ``subprocess.run(["true"])`` (on local also without its fork server,
``DS_LOCAL_FORKSERVER=0``); ``scan`` of a workspace of 1000 files of 4 KiB,
cold (a fresh Space handle, nothing cached) and after changing 10 files, against
``find DIR -type f -print0 | xargs -0 sha256sum`` on the same tree (on the host when the
workspace is a host directory, else inside the Space through one exec, which is said);
``advance_epoch`` with nothing of the old epoch started, after one command of it ended,
and with one still running (``sleep``, killed by the advance); the first exec of an
epoch (on local, the one that makes the epoch's cgroup).
A backend that cannot run here prints a skip line with its reason.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

from durable_spaces.backends import open_backend, unavailable_reason
from durable_spaces.space import Space, SpaceBackend

ROUNDS = 50
SCAN_ROUNDS = 3
FILES, FILE_SIZE, CHANGED = 1000, 4096, 10
BASELINE = "find . -type f -print0 | xargs -0 sha256sum > /dev/null"
MAKE_TREE = (
    f"for d in 0 1 2 3 4 5 6 7 8 9; do mkdir -p t/$d; done; "
    f"i=0; while [ $i -lt {FILES} ]; do "
    f"head -c {FILE_SIZE} /dev/urandom > t/$((i % 10))/f$i; i=$((i + 1)); done"
)
CHANGE = f"i=0; while [ $i -lt {CHANGED} ]; do head -c {FILE_SIZE} /dev/urandom > t/3/f$((i * 10 + 3)); i=$((i + 1)); done"  # noqa: E501


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def _line(backend: str, what: str, ms: float, base_what: str, base_ms: float) -> None:
    print(
        f"{backend:8s} {what:30s} {ms:9.2f} ms   {base_what:34s} {base_ms:8.2f} ms"
        f"   ratio {ms / base_ms:6.1f}x",
        flush=True,
    )


def _plain_true() -> float:
    xs = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        subprocess.run(["true"], check=True)
        xs.append(time.perf_counter() - t0)
    return _median_ms(xs)


async def _exec_round_trip(space: Space, keyed: bool) -> float:
    xs = []
    run = uuid.uuid4().hex[:8]
    for i in range(ROUNDS):
        key = f"bench-{run}:{i}:0@1" if keyed else None
        t0 = time.perf_counter()
        r = await space.exec(["true"], key=key, epoch=1)
        xs.append(time.perf_counter() - t0)
        assert r.exit_code == 0, r
    return _median_ms(xs)


async def _baseline(space: Space) -> tuple[str, float]:
    tree = os.path.join(space.root, "t")
    if os.path.isdir(tree):
        xs = []
        for _ in range(SCAN_ROUNDS):
            t0 = time.perf_counter()
            subprocess.run(["sh", "-c", BASELINE], cwd=tree, check=True)
            xs.append(time.perf_counter() - t0)
        return "find|xargs sha256sum (host)", _median_ms(xs)
    xs = []
    for _ in range(SCAN_ROUNDS):
        t0 = time.perf_counter()
        await space.exec(["sh", "-c", BASELINE], key=None, epoch=1, cwd="t")
        xs.append(time.perf_counter() - t0)
    return "find|xargs sha256sum (in Space, +exec)", _median_ms(xs)


async def _scan(name: str, backend: SpaceBackend, space: Space) -> None:
    r = await space.exec(["sh", "-c", MAKE_TREE], key=None, epoch=1)
    assert r.exit_code == 0, r.output
    await asyncio.sleep(0.2)  # let the tree age out of the racily-clean window
    base_what, base = await _baseline(space)
    cold, warm = [], []
    for _ in range(SCAN_ROUNDS):
        fresh = await backend.find(space.name)  # a new handle: nothing cached
        assert fresh is not None
        t0 = time.perf_counter()
        table = await fresh.scan("t")
        cold.append(time.perf_counter() - t0)
        assert len(table) == FILES, len(table)
        await space.exec(["sh", "-c", CHANGE], key=None, epoch=1)
        await asyncio.sleep(0.2)
        t0 = time.perf_counter()
        await fresh.scan("t")
        warm.append(time.perf_counter() - t0)
        await fresh.close()
    _line(name, f"scan {FILES}x4KiB cold", _median_ms(cold), base_what, base)
    _line(name, f"scan after {CHANGED} changed", _median_ms(warm), base_what, base)


async def _local_direct(backend: SpaceBackend, space_name: str, plain_ms: float) -> None:
    """local's exec without its fork server (``DS_LOCAL_FORKSERVER=0``): a fresh
    interpreter per command's supervisor, the fallback path."""
    from durable_spaces.backends.local.backend import LocalBackend

    assert isinstance(backend, LocalBackend)
    off = backend.settings.with_(local_forkserver=False)
    direct = await LocalBackend(backend.state_dir, settings=off).find(space_name)
    assert direct is not None  # a new handle: no server state kept
    for keyed in (False, True):
        ms = await _exec_round_trip(direct, keyed)
        what = "exec true (keyed, no server)" if keyed else "exec true (no fork server)"
        _line("local", what, ms, 'subprocess.run(["true"])', plain_ms)


async def _advance(name: str, space: Space, plain_ms: float) -> None:
    """The cost of ``advance_epoch``: idle, after a command of the old epoch ended, and
    with one still running (the advance kills it)."""
    idle, first, ended, running = [], [], [], []
    for _ in range(ROUNDS):
        e = await space.current_epoch()
        t0 = time.perf_counter()
        await space.advance_epoch(e + 1)
        idle.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await space.exec(["true"], key=None, epoch=e + 1)
        first.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await space.advance_epoch(e + 2)
        ended.append(time.perf_counter() - t0)
        ex = await space.spawn(["sleep", "100"], key=None, epoch=e + 2)
        t0 = time.perf_counter()
        await space.advance_epoch(e + 3)
        running.append(time.perf_counter() - t0)
        await ex.detach()
    base = 'subprocess.run(["true"])'
    _line(name, "exec true (first of its epoch)", _median_ms(first), base, plain_ms)
    _line(name, "advance_epoch (idle)", _median_ms(idle), base, plain_ms)
    _line(name, "advance_epoch (a command ended)", _median_ms(ended), base, plain_ms)
    _line(name, "advance_epoch (one running)", _median_ms(running), base, plain_ms)


async def bench_backend(name: str, plain_ms: float) -> None:
    reason = unavailable_reason(name)
    if reason is not None:
        print(f"{name:8s} skipped: {reason}", flush=True)
        return
    state = tempfile.mkdtemp(prefix=f"bench-spaces-{name}-")
    backend = open_backend(name, state)
    try:
        space = await backend.create(f"bench-{uuid.uuid4().hex[:8]}")
        await space.exec(["true"], key=None, epoch=1)  # warm up
        for keyed in (False, True):
            ms = await _exec_round_trip(space, keyed)
            what = "exec true (keyed)" if keyed else "exec true (key=None)"
            _line(name, what, ms, 'subprocess.run(["true"])', plain_ms)
        if name == "local":
            await _local_direct(backend, space.name, plain_ms)
        await _scan(name, backend, space)
        await _advance(name, space, plain_ms)
    finally:
        for n in await backend.names():
            await backend.delete(n)
        await backend.close()
        shutil.rmtree(state, ignore_errors=True)


async def main(backends: list[str]) -> None:
    plain = _plain_true()
    for name in backends:
        try:
            await bench_backend(name, plain)
        except Exception as e:  # one backend failing must not hide the others' figures
            print(f"{name:8s} failed: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="local,spacesd,docker")
    args = ap.parse_args()
    asyncio.run(main([b.strip() for b in args.backends.split(",") if b.strip()]))
