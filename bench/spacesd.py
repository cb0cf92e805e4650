"""spacesd Spaces: what the real daemon costs (``python -m bench.spacesd``).

Figures: create (daemon start in its PID namespace -> first answer), restart (SIGKILL of
the namespace, checked dead, + start -> first answer), a trivial exec with and without a
key against ``subprocess.run`` of the same command, and ``scan`` of 1000 files of 4 KiB,
cold and after changing 10 files, against ``find | xargs sha256sum`` on the same tree.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

ROUNDS = 30
FILES, FILE_SIZE, CHANGED = 1000, 4096, 10


def _ms(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1000:7.2f} ms  (min {min(xs) * 1000:.2f}, n={len(xs)})"


async def _timed(fn: Callable[[int], Awaitable[Any]], n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await fn(i)
        out.append(time.perf_counter() - t0)
    return out


def _plain(argv: list[str], cwd: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out


async def main() -> int:
    from durable_spaces.backends import spacesd
    from durable_spaces.backends.spacesd.daemon import unshare_reason

    reason = spacesd.unavailable_reason()
    if reason is not None:
        print(f"SKIP bench.spacesd: {reason}")
        return 0
    tmp = tempfile.mkdtemp(prefix="bench-spacesd-")
    backend = spacesd.SpacesdBackend(os.path.join(tmp, "state"))
    why = unshare_reason()
    isolation = "pid namespace" if why is None else f"process group ({why})"
    print(f"spacesd bench (isolation: {isolation})")
    try:
        boots = []
        for i in range(5):
            t0 = time.perf_counter()
            await backend.create(f"boot{i}")
            boots.append(time.perf_counter() - t0)
            await backend.delete(f"boot{i}")
        print(f"create -> first answer       {_ms(boots)}")
        space = await backend.create("bench")
        restarts = await _timed(lambda i: backend.restart("bench"), 5)
        print(f"restart -> first answer      {_ms(restarts)}")
        await space.exec(["true"], key=None, epoch=1)  # connect
        plain = _plain(["true"], space.root, ROUNDS)
        nokey = await _timed(lambda i: space.exec(["true"], key=None, epoch=1), ROUNDS)
        keyed = await _timed(lambda i: space.exec(["true"], key=f"b:{i}@1", epoch=1), ROUNDS)
        replay = await _timed(lambda i: space.exec(["true"], key=f"b:{i}@1", epoch=1), ROUNDS)
        base = statistics.median(plain)
        print(f"subprocess.run(true)         {_ms(plain)}")
        for label, xs in (("no key", nokey), ("new key", keyed), ("replayed key", replay)):
            ratio = statistics.median(xs) / base
            print(f"exec true, {label:<18}{_ms(xs)}  x{ratio:.1f}")

        data = os.urandom(FILE_SIZE)
        for i in range(FILES):
            d = os.path.join(space.root, "tree", f"d{i % 20}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"f{i}"), "wb") as f:
                f.write(data[i % 64 :] + data[: i % 64])
        await asyncio.sleep(0.1)  # out of the racy window, so the cold scan caches
        ref_cmd = ["sh", "-c", "find tree -type f -print0 | xargs -0 sha256sum > /dev/null"]
        ref = _plain(ref_cmd, space.root, 3)
        t0 = time.perf_counter()
        table = await space.scan("tree")
        cold = time.perf_counter() - t0
        assert len(table) == FILES, len(table)
        for i in range(CHANGED):
            with open(os.path.join(space.root, "tree", f"d{i % 20}", f"f{i}"), "ab") as f:
                f.write(b"changed")
        before = space.scan_stats["hashed"]
        t0 = time.perf_counter()
        await space.scan("tree")
        warm = time.perf_counter() - t0
        rehashed = space.scan_stats["hashed"] - before
        r = statistics.median(ref)
        print(f"find|xargs sha256sum, {FILES} files   {r * 1000:7.1f} ms")
        print(f"scan cold                    {cold * 1000:7.1f} ms  x{cold / r:.2f}")
        print(
            f"scan after {CHANGED} changed       {warm * 1000:7.1f} ms  x{warm / r:.2f}"
            f"  (re-hashed {rehashed})"
        )
        return 0
    finally:
        for name in await backend.names():
            await backend.delete(name)
        await backend.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
