"""Commit latency of the durable log, next to a raw ``write`` + ``fsync`` of the same bytes.

    python -m bench.log [--commits 300] [--op-bytes 1024] [--dir DIR]

Each storage gets a fresh file in DIR (default: a temp dir under bench/out/, on the same
disk as the repo) and appends ``--commits`` commits of one ~1 KiB op; the raw baseline
appends the JSONL line of each commit to a plain file with ``os.write`` + ``os.fsync``.
Ratios are to the raw baseline at the same percentile: how much the storage costs over
the sync the disk needs anyway. The kinds take turns in rounds (their order rotating) so
that drift on a shared disk hits them alike; expect noise of tens of percent anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from durable_spaces.harness.log import (
    JsonlStorage,
    SqliteStorage,
    Storage,
    open_fenced_jsonl,
    open_fenced_sqlite,
)

ROUNDS = 10


def _op(n: int, size: int) -> dict[str, object]:
    return {"kind": "entry", "n": n, "text": "x" * max(0, size - 40)}


class _RawFsync:
    """The floor: the same bytes a JSONL commit writes, appended and fsynced, nothing else."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._seq = 0

    def append(self, ops: list[dict[str, object]]) -> int:
        self._seq += 1
        line = json.dumps({"seq": self._seq, "epoch": None, "ops": ops}, separators=(",", ":"))
        os.write(self._fd, (line + "\n").encode())
        os.fsync(self._fd)
        return self._seq

    def close(self) -> None:
        os.close(self._fd)


Kind = Callable[[Path], "Storage | _RawFsync"]

KINDS: dict[str, Kind] = {
    "raw write+fsync": lambda d: _RawFsync(d / "raw.bin"),
    "SQLite NORMAL": lambda d: SqliteStorage(d / "normal.db"),
    "SQLite FULL": lambda d: SqliteStorage(d / "full.db", synchronous="FULL"),
    "JSONL": lambda d: JsonlStorage(d / "log.jsonl"),
    "SQLite fenced": lambda d: open_fenced_sqlite(d / "fenced.db", 1)[0],
    "JSONL fenced": lambda d: open_fenced_jsonl(d / "fenced.jsonl", 1)[0],
}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def run(commits: int, op_bytes: int, directory: Path) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {k: [] for k in KINDS}
    opened = {k: make(directory) for k, make in KINDS.items()}
    try:
        for s in opened.values():  # warm up: create tables, first WAL frames, inodes
            for i in range(5):
                s.append([_op(-i, op_bytes)])
        names = list(KINDS)
        per_round = -(-commits // ROUNDS)
        for r in range(ROUNDS):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                s = opened[name]
                for i in range(per_round):
                    ops = [_op(r * per_round + i, op_bytes)]
                    t = time.perf_counter()
                    s.append(ops)
                    samples[name].append(time.perf_counter() - t)
    finally:
        for s in opened.values():
            s.close()
    return {k: v[:commits] for k, v in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commits", type=int, default=300)
    p.add_argument("--op-bytes", type=int, default=1024)
    p.add_argument("--dir", type=Path, default=None)
    a = p.parse_args()
    base = a.dir or Path(__file__).resolve().parent / "out"
    base.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="log-bench-", dir=base))
    try:
        t0 = time.monotonic()
        samples = run(a.commits, a.op_bytes, directory)
        took = time.monotonic() - t0
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    raw = samples["raw write+fsync"]
    raw50, raw95 = _pct(raw, 0.5), _pct(raw, 0.95)
    print(f"commit latency: {a.commits} commits of one ~{a.op_bytes} B op, in {base}")
    print(
        f"{'storage':<18}{'p50 ms':>9}{'p95 ms':>9}{'mean ms':>9}{'p50 x raw':>11}{'p95 x raw':>11}"
    )
    for name, xs in samples.items():
        p50, p95 = _pct(xs, 0.5), _pct(xs, 0.95)
        print(
            f"{name:<18}{p50 * 1e3:>9.3f}{p95 * 1e3:>9.3f}{statistics.fmean(xs) * 1e3:>9.3f}"
            f"{p50 / raw50:>11.2f}{p95 / raw95:>11.2f}"
        )
    print(
        f"({took:.1f} s. SQLite NORMAL in WAL mode syncs at checkpoints, not per commit: it\n"
        " survives any process crash, a power loss may roll back its last commits. FULL and\n"
        " JSONL sync every commit. Fenced = NORMAL/JSONL plus the epoch floor check.)"
    )


if __name__ == "__main__":
    main()
