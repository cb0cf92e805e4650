"""The exec ledger of a ``local`` Space: ``ledger.jsonl``, one line per key, appended and
fsynced before the key's command is spawned, and the record of a key read from its line
and its command's files (``cmds/<id>/``: meta.json, output, status).

A key's line names its command directory. The line alone (no ``meta.json``) means the
driver died before the supervisor was recorded: the command never starts and the key
reads ``lost``. A torn last line is a writer that died mid-append: never spawned.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_spaces.backends.local.disk import read_json, tail
from durable_spaces.backends.local.procs import alive
from durable_spaces.host.bounded import open_file, parse_json
from durable_spaces.space import ExecRecord, ExecState


class Ledger:
    """``path`` read incrementally (only bytes appended since the last look are read);
    ``check`` raises ``SpaceGoneError`` when the file is missing because the Space is."""

    def __init__(self, path: Path, check: Callable[[], None]) -> None:
        self._path = path
        self._check = check
        self._lines: dict[str, dict[str, Any]] = {}
        self._offset = 0
        self._lock = threading.Lock()  # spawn and exec_record run in worker threads

    def line(self, key: str) -> dict[str, Any] | None:
        """The ledger's line for ``key``."""
        with self._lock:
            try:
                with os.fdopen(open_file(self._path), "rb") as f:  # never a FIFO's wait
                    f.seek(self._offset)
                    data = f.read()
            except FileNotFoundError:
                self._check()
                raise
            end = data.rfind(b"\n") + 1  # a torn last line is left for a later look
            for raw in data[:end].splitlines():
                try:
                    rec = parse_json(raw, where=f"{self._path}: a line")
                except ValueError:
                    continue  # a torn line from a writer that died: never spawned
                self._lines.setdefault(rec["key"], rec)
            self._offset += end
            return self._lines.get(key)

    def append(self, rec: dict[str, Any]) -> None:
        """Append ``rec`` as a line and fsync (after a torn line, on a line of its own)."""
        with open(self._path, "ab") as f:
            sep = b""
            if f.tell() > 0:
                with open(self._path, "rb") as r:
                    r.seek(-1, os.SEEK_END)
                    sep = b"" if r.read(1) == b"\n" else b"\n"
            f.write(sep + json.dumps(rec, separators=(",", ":")).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())


def record(cmds: Path, key: str, line: dict[str, Any] | None) -> ExecRecord:
    """The record of ``key`` from its ledger ``line`` and its directory under ``cmds``."""
    if line is None:
        return ExecRecord(key=key, state=ExecState.UNKNOWN)
    cmd_dir = cmds / line["cmd"]
    meta = read_json(cmd_dir / "meta.json") or {}
    pid = meta.get("pid")
    status = read_json(cmd_dir / "status")
    output = tail(cmd_dir / "output")
    epoch = line.get("epoch")
    if status is not None:
        return ExecRecord(
            key,
            ExecState.EXITED,
            epoch,
            pid,
            status.get("exit_code"),
            status.get("signal"),
            output,
        )
    if pid is not None and alive(pid, meta["ctime"]):
        return ExecRecord(key, ExecState.RUNNING, epoch, pid, output_tail=output)
    if (cmd_dir / "status").exists():  # it ended between our two looks
        return record(cmds, key, line)
    return ExecRecord(key, ExecState.LOST, epoch, pid, output_tail=output)
