"""Throughput through powerfs next to the raw backing dir it sits on.

    python -m bench.powerfs [--count 500] [--size 4096] [--dir DIR]

Workloads, each on a fresh file, run on the mount and then on a plain directory of the
same disk: ``write+fsync`` (append ``--size`` bytes and fsync, ``--count`` times),
``write`` (the same appends, one fsync at the end: the volatile path), ``sqlite FULL``
(one-row commits of the project's SqliteStorage with ``synchronous=FULL``). Then the time
one ``cut()`` takes (drop, lay the live tree out again, remount). Figures are per second;
the ratio is raw over powerfs (how many times slower the layer is). On a shared machine
expect tens of percent of noise.

An fsync through powerfs copies the synced bytes into the backing dir but does not fsync
the backing dir for real (the layer simulates the power loss of the mount, not of the
host), so ``write+fsync`` can beat the raw disk: read it as the layer's cost per call,
not as the disk's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from durable_spaces.chaos.powerfs import mount, unavailable
from durable_spaces.harness.log import SqliteStorage


def _appends(path: Path, count: int, size: int, *, each: bool) -> float:
    block = b"x" * size
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    t0 = time.perf_counter()
    for _ in range(count):
        os.write(fd, block)
        if each:
            os.fsync(fd)
    os.fsync(fd)
    dt = time.perf_counter() - t0
    os.close(fd)
    return count / dt


def _sqlite(path: Path, count: int, size: int) -> float:
    s = SqliteStorage(path, synchronous="FULL")
    t0 = time.perf_counter()
    for i in range(count):
        s.append([{"n": i}])
    dt = time.perf_counter() - t0
    s.close()
    return count / dt


WORKLOADS: dict[str, Callable[[Path, int, int], float]] = {
    "write+fsync": lambda p, c, s: _appends(p, c, s, each=True),
    "write": lambda p, c, s: _appends(p, c, s, each=False),
    "sqlite FULL": _sqlite,
}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.powerfs")
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--dir", help="where the backing and raw dirs go (default: a temp dir)")
    args = ap.parse_args()
    why = unavailable()
    if why is not None:
        raise SystemExit(f"bench.powerfs: cannot run here: {why}")
    base = Path(tempfile.mkdtemp(prefix="bench-powerfs-", dir=args.dir))
    raw, backing, mnt = base / "raw", base / "backing", base / "mnt"
    for d in (raw, backing, mnt):
        d.mkdir()
    try:
        t0 = time.perf_counter()
        fs = mount(backing, mnt, state_dir=base / "state")
        mount_s = time.perf_counter() - t0
        print(f"powerfs bench: count={args.count} size={args.size} dir={base}")
        print(f"{'workload':<14}{'raw/s':>12}{'powerfs/s':>12}{'ratio':>8}")
        for name, run in WORKLOADS.items():
            on_raw = run(raw / name.replace(" ", "_"), args.count, args.size)
            on_fs = run(mnt / name.replace(" ", "_"), args.count, args.size)
            print(f"{name:<14}{on_raw:>12.0f}{on_fs:>12.0f}{on_raw / on_fs:>8.1f}")
        mib = args.count * args.size / 2**20
        print(f"mount: {mount_s * 1000:.0f} ms; workloads left {mib * 2:.1f} MiB on the mount")
        t0 = time.perf_counter()
        fs.cut()
        print(f"cut (drop, lay out, remount): {(time.perf_counter() - t0) * 1000:.0f} ms")
        fs.unmount(sync=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
