"""The log as raw commits, read with ``sqlite3`` and ``json`` directly.

The formats (written by ``durable_spaces/harness/log_sqlite.py`` and
``durable_spaces/harness/log_jsonl.py``; read here without them):

- SQLite: table ``cua_commits(seq INTEGER PRIMARY KEY, epoch INTEGER, ops TEXT)`` with
  ``ops`` a JSON list, and the one-row ``cua_fence(id = 1, floor)``. Opened through a
  read-only URI (``file:...?mode=ro``): the checker never takes a lock a writer needs.
- JSONL: the log's identity ``{"log": "<32 hex>"}`` on its first line (a log written
  before identities has none), then one ``{"seq": n, "epoch": e, "ops": [...]}`` per
  line, seq = the line number after the identity's. A
  crash can tear only the last line (bytes without a newline, or a last line that does
  not parse); that is tolerated and reported in ``torn_tail``, as the adapter does.
  A bad line anywhere before it is damage: ``CorruptLogError`` naming the line.

The log records no wall-clock time in its ops. What it does leave is its files' own
times: every commit writes the log file (SQLite: its ``-wal``, or the main file when a
checkpoint copies the WAL back), so the newest of their mtimes is an upper bound on the
time of the last commit (``written_ns``; read before the log is opened, since even a
read-only open may create an empty ``-wal``).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_spaces.errors import BadFileError, CorruptLogError, LogError
from durable_spaces.host.bounded import open_file, parse_json, read_bytes

SQLITE_MAGIC = b"SQLite format 3\x00"
#: A WAL file this small holds no frame (its header is 32 bytes).
_WAL_HEADER = 32
#: A log the checker reads whole (a campaign run's are kilobytes to megabytes).
MAX_LOG_BYTES = 1 << 32
#: How deep a commit's ops may nest: what the harness's own ``json.dumps`` can write.
LOG_DEPTH = 900


@dataclass(frozen=True)
class RawCommit:
    """One commit as stored: its seq, the epoch that wrote it (None: unfenced), its ops."""

    seq: int
    epoch: int | None
    ops: list[dict[str, Any]]


@dataclass(frozen=True)
class RawLog:
    path: str
    format: str  # "sqlite" | "jsonl"
    commits: list[RawCommit]
    floor: int | None = None  # SQLite's fence floor (None: no fence table / JSONL)
    torn_tail: str | None = None  # JSONL: what a crash left after the last whole line
    written_ns: int | None = None  # newest mtime of the log's files (see module doc)


def log_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files that make up the log at ``path`` (SQLite: with its -wal if present)."""
    p = Path(path)
    return [f for f in (p, Path(f"{p}-wal")) if f.exists()]


def written_ns(path: str | os.PathLike[str]) -> int | None:
    """Newest mtime of the log's files that hold data (an empty -wal holds none)."""
    times = []
    for f in log_files(path):
        st = f.stat()
        if f.name.endswith("-wal") and st.st_size <= _WAL_HEADER:
            continue
        times.append(st.st_mtime_ns)
    return max(times, default=None)


def read_log(path: str | os.PathLike[str]) -> RawLog:
    """Read a SQLite or JSONL log (told apart by the SQLite header, not the name)."""
    p = Path(path)
    try:  # a FIFO or a device in the log's place is refused, never waited on
        fd = open_file(p)
        try:
            head = os.read(fd, len(SQLITE_MAGIC))
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise LogError(f"no log at {p}") from None
    except BadFileError as e:
        raise LogError(str(e)) from None
    if head == SQLITE_MAGIC:
        return read_sqlite(p)
    return read_jsonl(p)


def _ops(text: Any, where: str) -> list[dict[str, Any]]:
    try:
        ops = (
            parse_json(text, where=where, max_depth=LOG_DEPTH)
            if isinstance(text, str | bytes)
            else text
        )
    except ValueError as e:
        raise CorruptLogError(f"{where}: ops are not valid JSON ({e})") from e
    if not isinstance(ops, list) or not all(isinstance(o, dict) for o in ops):
        raise CorruptLogError(f"{where}: ops are not a list of objects")
    return ops


def _epoch(value: Any, where: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise CorruptLogError(f"{where}: epoch {value!r} is not an integer")


def read_sqlite(path: str | os.PathLike[str]) -> RawLog:
    p = Path(path).absolute()
    written = written_ns(p)
    try:
        conn = sqlite3.connect(f"{p.as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise LogError(f"{p}: cannot open read-only: {e}") from e
    try:
        rows = conn.execute("SELECT seq, epoch, ops FROM cua_commits ORDER BY seq").fetchall()
        try:
            row = conn.execute("SELECT floor FROM cua_fence WHERE id = 1").fetchone()
        except sqlite3.OperationalError:
            row = None
    except sqlite3.DatabaseError as e:
        raise CorruptLogError(f"{p} is not a readable commit log: {e}") from e
    finally:
        conn.close()
    commits = []
    for seq, epoch, text in rows:
        where = f"{p}: commit {seq}"
        commits.append(RawCommit(int(seq), _epoch(epoch, where), _ops(text, where)))
    floor = int(row[0]) if row is not None and row[0] is not None else None
    return RawLog(str(p), "sqlite", commits, floor=floor, written_ns=written)


def read_jsonl(path: str | os.PathLike[str]) -> RawLog:
    p = Path(path).absolute()
    written = written_ns(p)
    try:
        data = read_bytes(p, max_bytes=MAX_LOG_BYTES)
    except BadFileError as e:
        raise LogError(str(e)) from None
    lines = data.split(b"\n")
    whole, rest = lines[:-1], lines[-1]
    commits: list[RawCommit] = []
    torn = None
    header = 0
    for i, raw in enumerate(whole):
        lineno = i + 1
        where = f"{p}: line {lineno}"
        try:
            obj = parse_json(raw, where=where, max_depth=LOG_DEPTH)
        except ValueError as e:
            if i == len(whole) - 1 and not rest:
                torn = f"line {lineno}: unparsable ({e})"
                break
            raise CorruptLogError(f"{where} is not valid JSON ({e}), before the last line") from e
        if i == 0 and isinstance(obj, dict) and set(obj) == {"log"}:
            header = 1  # the log's identity, not a commit
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("ops"), list):
            raise CorruptLogError(f"{where} is not a commit record")
        seq = lineno - header
        if obj.get("seq") != seq:
            raise CorruptLogError(f"{where} holds seq {obj.get('seq')!r}")
        commits.append(RawCommit(seq, _epoch(obj.get("epoch"), where), _ops(obj["ops"], where)))
    if rest:
        torn = f"line {len(whole) + 1}: {len(rest)} bytes without a newline"
    return RawLog(str(p), "jsonl", commits, torn_tail=torn, written_ns=written)
