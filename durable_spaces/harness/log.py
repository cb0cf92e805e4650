"""The durable log: one line of atomic commits, and the epoch fence that guards it.

A log is a sequence of commits; a commit is a list of JSON operations (entries,
documents, task state, submissions) that the harness interprets. The storage knows
nothing of their meaning: it only promises that a commit is stored whole or not at all,
in order, and that nothing is visible before it is stored. Reopening a storage replays
its commits. Only ``log_sqlite`` speaks SQL.

Storages: ``MemoryStorage`` (tests; ``log_core``), SQLite (WAL; exact fence;
``log_sqlite``), JSONL (append-only, fsync per commit; best-effort fence with marker
files; ``log_jsonl``); the safe opening of their files is ``log_files``. This module is
their public face: import from here.
"""

from __future__ import annotations

import os
from typing import Literal

from durable_spaces.errors import ConfigError
from durable_spaces.harness.log_core import (
    MAX_EPOCH,
    Commit,
    Fence,
    LogOp,
    MemoryFence,
    MemoryStorage,
    Storage,
    check_epoch,
)
from durable_spaces.harness.log_jsonl import (
    MAX_LINE_BYTES,
    FencedFileSystem,
    JsonlStorage,
    open_fenced_jsonl,
)
from durable_spaces.harness.log_sqlite import (
    APPLICATION_ID,
    SqliteFence,
    SqliteStorage,
    open_fenced_sqlite,
)

__all__ = [
    "APPLICATION_ID",
    "MAX_EPOCH",
    "MAX_LINE_BYTES",
    "Commit",
    "Fence",
    "FencedFileSystem",
    "JsonlStorage",
    "LogOp",
    "MemoryFence",
    "MemoryStorage",
    "SqliteFence",
    "SqliteStorage",
    "Storage",
    "check_epoch",
    "open_fenced_jsonl",
    "open_fenced_sqlite",
    "open_storage",
]

# --- files on disk ------------------------------------------------------------------------
#
# Why these choices (the reasoning the code below keeps):
#
# - One owner per storage. Two processes appending to one log without coordination is
#   silent corruption (SQLite would serialize them, but two harnesses would interleave
#   their commits; two JSONL writers would reuse seqs). So an unfenced storage takes an
#   exclusive ``flock`` on a sidecar ``<path>.lock`` for its whole life and a second
#   opener gets ``StorageLockedError`` (``log_files.OwnerLock``).
# - A fenced log is the exception: during a takeover a stale driver (older epoch) and
#   the new one are both alive and both open the file. There the *fence* is what keeps
#   the line consistent, so fenced opens take the sidecar lock *shared*: any number of
#   fenced writers together, but never alongside an unfenced exclusive owner.
# - Nothing at a log path is trusted (``log_files``): no symlinks, regular files only,
#   0600 files and 0700 directories. A SQLite log is created whole (built under a
#   temporary name, then hard-linked into place), so a zero-length file at the path is
#   never one of ours; ours carry ``PRAGMA application_id`` and exactly our two tables.
#   Another program's database is recognised from its header and schema, read without
#   writing anything, and refused before the first write.
# - SQLite (WAL, ``BEGIN IMMEDIATE``) is the exact fence: the floor is read and raised in
#   the same write transaction as the commit, so a stale commit is refused atomically.
#   ``synchronous=NORMAL`` survives any process crash; after a power loss the last few
#   commits may roll back (never tear). ``FULL`` syncs the WAL on every commit.
# - JSONL is one ``os.write`` of a whole line plus ``fsync`` per commit. A crash can tear
#   only the last line; that is reported and truncated before the next append. Anything
#   wrong before the last line is damage, never skipped silently. A line is at most
#   ``MAX_LINE_BYTES`` (an append refuses a bigger commit), so a longer one is damage too
#   and is never read into memory whole.
# - Failpoints: ``log.before_commit`` fires when a commit is built but not yet stored
#   (SQLite: inside the transaction; JSONL: before the write), ``log.after_commit`` right
#   after it is durable. A kill at the first loses the commit whole; at the second keeps it.
#   ``log.short_write`` (JSONL) fires after a write that stored only part of a line.


def open_storage(
    url_or_path: str | os.PathLike[str],
    *,
    synchronous: Literal["NORMAL", "FULL"] | str = "NORMAL",
) -> Storage:
    """Open an unfenced, exclusively owned storage from ``sqlite:PATH``, ``jsonl:PATH`` or
    ``memory:`` (``sqlite:///abs`` also works). A bare path picks JSONL for ``*.jsonl``
    and SQLite otherwise."""
    text = os.fspath(url_or_path)
    scheme, sep, rest = text.partition(":")
    if not sep or scheme not in ("sqlite", "jsonl", "memory"):
        scheme, rest = ("jsonl" if text.endswith(".jsonl") else "sqlite"), text
    elif rest.startswith("//"):
        rest = rest[2:]
    if scheme == "memory":
        if rest:
            raise ConfigError(f"memory storage takes no path: {text!r}")
        return MemoryStorage()
    if not rest:
        raise ConfigError(f"storage URL {text!r} has no path (use {scheme}:PATH)")
    if scheme == "jsonl":
        return JsonlStorage(rest)
    return SqliteStorage(rest, synchronous=synchronous)
