"""A real writer process for the log's crash and fence tests (not a test module).

    python log_child.py KIND PATH EPOCH loop COUNT PAD [SLEEP]
    python log_child.py KIND PATH EPOCH serve

KIND is sqlite, sqlite-full, jsonl, fenced-sqlite or fenced-jsonl (EPOCH is ignored by
the unfenced kinds). It prints ``ready`` once the storage is open. ``loop`` appends COUNT
commits of ``ops_for(i, PAD)`` and prints ``done <seq>`` (flushed) after each append
returns; on a stale epoch it prints ``stale <epoch> <floor>`` and exits 75. ``serve``
reads one command per line from stdin (append, check, halt, quit) and answers one line.
``LOG_CHILD_FSIZE=N`` caps the size of files it writes (``RLIMIT_FSIZE``) once it is open.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

from durable_spaces.errors import StaleEpochError
from durable_spaces.harness.log import (
    JsonlStorage,
    SqliteStorage,
    Storage,
    open_fenced_jsonl,
    open_fenced_sqlite,
)

PARTS = 3


def ops_for(i: int, pad: int) -> list[dict[str, Any]]:
    """The ops of the i-th commit a child writes: several ops, so a half commit shows."""
    return [{"n": i, "part": j, "pad": "x" * pad} for j in range(PARTS)]


def open_kind(kind: str, path: str, epoch: int) -> tuple[Storage, Any]:
    if kind == "sqlite":
        return SqliteStorage(path), None
    if kind == "sqlite-full":
        return SqliteStorage(path, synchronous="FULL"), None
    if kind == "jsonl":
        return JsonlStorage(path), None
    if kind == "fenced-sqlite":
        return open_fenced_sqlite(path, epoch)
    if kind == "fenced-jsonl":
        return open_fenced_jsonl(path, epoch)
    raise SystemExit(f"unknown kind {kind}")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    kind, path, epoch, mode = argv[0], argv[1], int(argv[2]), argv[3]
    storage, fence = open_kind(kind, path, epoch)
    if limit := os.environ.get("LOG_CHILD_FSIZE"):  # a file size limit forces short writes
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.RLIM_INFINITY))
    say("ready")
    if mode == "loop":
        count, pad = int(argv[4]), int(argv[5])
        pause = float(argv[6]) if len(argv) > 6 else 0.0
        start = len(storage.load())
        for i in range(start + 1, start + count + 1):
            try:
                seq = storage.append(ops_for(i, pad))
            except StaleEpochError as e:
                say(f"stale {e.epoch} {e.floor}")
                return 75
            say(f"done {seq}")
            if pause:
                time.sleep(pause)
        storage.close()
        return 0
    n = 0
    for line in sys.stdin:
        cmd = line.strip()
        try:
            if cmd == "append":
                n += 1
                say(f"ok {storage.append([{'writer': epoch, 'n': n}])}")
            elif cmd == "check":
                fence.check()
                say("ok")
            elif cmd == "halt":
                fence.halt("test")
                say("halted")
            elif cmd == "quit":
                break
            else:
                say(f"unknown {cmd}")
        except StaleEpochError as e:
            say(f"stale {type(e).__name__} {e.epoch} {e.floor}")
    storage.close()
    say("bye")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
