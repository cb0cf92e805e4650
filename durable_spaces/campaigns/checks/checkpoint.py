"""Checkpoint runs: the log's last checkpoint is the workspace as the run left it
(``checkpoint_mismatch``).

Why a check of its own: a checkpoint that missed a change (a journal that lost an event,
a walk that trusted a stale stat key) leaves the workspace as it should be until a crash
makes a recovery restore it; the effect checks see it only in runs where that happens.
This check sees it in every run: after the last call, nothing changes the workspace, so
the checkpoint recorded after that call must describe it exactly.

The manifest is read raw: its bytes from the Space's copy beside the workspace
(``.ds-checkpoints/<id>.manifest``, on the host where the workspace is a directory here,
else by ``cat`` in the Space), or from the checkpoint store's directory when the copy
lacks it (a Space placed again from the store holds none of the earlier ones), checked
against the sha256 its id names and decoded here as the JSON it is (``{"format",
"version", "entries": [[path, kind, mode, size, ref, mtime_ns], ...]}``), not with the
adapter's decoder. Compared: the set of files,
directories and symlinks, each file's sha256, size and mode, each directory's mode, each
symlink's target (hard links as their first path's file), and each file's mtime to the
microsecond where the workspace was read with nanoseconds (a restore sets a file's time
from the manifest, so a checkpoint that missed a ``touch`` restores the wrong one; a
restore carries times as floats, and a directory's or a link's time moves with what a
restore writes, so those are left out). Not compared: FIFOs, sockets and devices (no
checkpoint holds them; ``effects`` reports them).

Not checked, with the reason said: a mode other than ``checkpoint``; a last call without
a checkpoint of its own (an interrupted one keeps the one before it); a machine
checkpoint (microvm: no manifest to read); a ``server`` run, whose process keeps writing
after the last call.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from durable_spaces.campaigns.checks.history import History
from durable_spaces.campaigns.checks.verdict import Anomaly, Verdict, anomaly, judge, passed
from durable_spaces.campaigns.checks.workspace import HOST_KINDS
from durable_spaces.errors import BadFileError
from durable_spaces.host.bounded import parse_json, read_bytes
from durable_spaces.space import Space

if TYPE_CHECKING:
    from durable_spaces.campaigns.checks.workspace import Workspace

DOC = "cua.space"
#: A manifest checkpoint's id (the checker's own reading: slug, ``-m``, sha256).
MANIFEST_ID = re.compile(r"[A-Za-z0-9_-]{1,40}-m([0-9a-f]{64})")
COPY_DIR = ".ds-checkpoints"
#: Why a last checkpoint was not read: a machine's (the microvm backend: memory and
#: disk, whose own checks are the workspace's against the log) or an old tar.
NOT_A_MANIFEST = "not a manifest checkpoint id"
_KINDS = {"f": "file", "h": "file", "d": "dir", "l": "symlink"}
#: How far a restored file's mtime may be from its manifest's: a restore's tar carries
#: times as floats (about 240 ns apart at today's dates), so it lands within a microsecond.
RESTORED_NS = 1000
#: A manifest has a row per path (about 150 bytes): a million paths fit.
MAX_MANIFEST_BYTES = 256 << 20


@dataclass(frozen=True)
class LastCheckpoint:
    """The log's last checkpoint and its manifest's bytes as the Space's copy held them
    (``data`` None: ``unread`` says why)."""

    id: str
    data: bytes | None = None
    unread: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "unread": self.unread}


def last_id(history: History) -> str | None:
    """The checkpoint a checkpoint-mode log records after its last call, or None."""
    state = history.docs.get(DOC) or {}
    if state.get("mode") != "checkpoint":
        return None
    calls = [c for c in (state.get("calls") or {}).values() if isinstance(c, dict)]
    if not calls:
        return None
    last = max(calls, key=lambda c: int(c.get("order") or 0))
    cid = last.get("checkpoint")
    if not isinstance(cid, str) or cid != state.get("last_checkpoint"):
        return None
    return cid


async def read_last(
    space: Space, kind: str, history: History, store: str | os.PathLike[str] | None = None
) -> LastCheckpoint | None:
    """The manifest of the log's last checkpoint: from the Space's copy, else (a Space
    placed again from the store holds no copy of what came before) from ``store``."""
    cid = last_id(history)
    if cid is None:
        return None
    if not MANIFEST_ID.fullmatch(cid):
        return LastCheckpoint(cid, unread=NOT_A_MANIFEST)
    name = cid + ".manifest"
    copy = posixpath.join(posixpath.dirname(space.root.rstrip("/")), COPY_DIR, name)
    if kind in HOST_KINDS and os.path.isdir(space.root):
        data, why = _read_host(copy)
    else:
        epoch = await space.current_epoch()
        res = await space.exec(
            ["sh", "-c", f"exec cat -- {shlex.quote(copy)}"], key=None, epoch=epoch, cwd="/"
        )
        data, why = (
            (res.output, "") if res.exit_code == 0 else (None, f"cat {copy}: exit {res.exit_code}")
        )
    if data is None and store is not None:
        data, why_store = _read_host(os.path.join(os.fspath(store), name))
        why = f"{why}; {why_store}" if data is None else ""
        data = data if data is None else _manifest_part(data)
    elif data is None:
        why = f"{why}; no store was given to look in"
    return LastCheckpoint(cid, data, why)


#: The footer of a store's manifest file that carries blobs after the manifest
#: (``adapter/checkpoints/carry.py``): magic, the manifest's length, the entries' count.
_CARRY_MAGIC = b"DS-CARRY"
_CARRY_FOOTER = 24


def _manifest_part(data: bytes) -> bytes:
    """The manifest of a store's file: the bytes before the carried blobs when it ends
    in their footer (read here, not through the adapter's parser: the digest check
    that follows says whether it is the manifest the id names)."""
    if len(data) >= _CARRY_FOOTER and data[-_CARRY_FOOTER:-16] == _CARRY_MAGIC:
        length = int.from_bytes(data[-16:-8], "big")
        if length <= len(data) - _CARRY_FOOTER:
            return data[:length]
    return data


def _read_host(path: str) -> tuple[bytes | None, str]:
    try:  # a FIFO or a device in a manifest's place (/dev/zero) is refused, never read
        return read_bytes(path, max_bytes=MAX_MANIFEST_BYTES, follow=False), ""
    except BadFileError as e:
        return None, str(e)
    except OSError as e:
        return None, f"{path}: {e.strerror}"


def _entries(data: bytes) -> dict[str, list[Any]]:
    doc = parse_json(data.decode("ascii"), where="a manifest", max_depth=None)  # rows read flat
    if doc.get("format") != "durable-spaces.manifest" or doc.get("version") != 1:
        raise ValueError("not a version-1 manifest")
    return {str(row[0]): row for row in doc["entries"]}


class ServerWorkload(Protocol):
    """What the checkpoint checks read of the workload: whether it runs a server."""

    @property
    def server(self) -> bool: ...


class _Inputs(Protocol):
    """What this check reads of a run (``inputs.Inputs``): a protocol, so this module does
    not import the inputs that import it."""

    @property
    def checkpoint(self) -> LastCheckpoint | None: ...

    @property
    def workload(self) -> ServerWorkload | None: ...

    @property
    def history(self) -> History: ...

    @property
    def workspace(self) -> Workspace: ...


def checkpoint_equals_workspace(inputs: _Inputs) -> Verdict:
    last = inputs.checkpoint
    if last is None:
        return passed("not a checkpoint run ending in a checkpoint of its last call")
    if inputs.workload is not None and inputs.workload.server:
        return passed("a server run: its process writes after the last call")
    if last.unread == NOT_A_MANIFEST:
        return passed(f"{last.id[:40]} is not a workspace manifest (a machine checkpoint)")
    seq = inputs.history.doc_seq.get(DOC, 0)
    m = MANIFEST_ID.fullmatch(last.id)
    if last.data is None or m is None:
        why = last.unread or "no manifest"
        return judge([anomaly("checkpoint_mismatch", f"{last.id}: {why}", witness=[seq])], "")
    if hashlib.sha256(last.data).hexdigest() != m.group(1):
        detail = f"{last.id}: the copy's bytes are not the manifest the id names"
        return judge([anomaly("checkpoint_mismatch", detail, witness=[seq])], "")
    try:
        rows = _entries(last.data)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError) as e:
        detail = f"{last.id}: unreadable manifest: {e}"
        return judge([anomaly("checkpoint_mismatch", detail, witness=[seq])], "")
    out: list[Anomaly] = []

    def bad(path: str, detail: str) -> None:
        out.append(anomaly("checkpoint_mismatch", detail, path=path, witness=[seq]))

    nodes = {
        p: n for p, n in inputs.workspace.nodes.items() if n.kind in ("file", "dir", "symlink")
    }
    times = inputs.workspace.fine_times  # nanoseconds known (a host walk, a pax tar)
    for path in sorted(set(rows) | set(nodes)):
        row, n = rows.get(path), nodes.get(path)
        if n is None:
            bad(path, "in the checkpoint, not in the workspace")
            continue
        if row is None:
            bad(path, f"a {n.kind} in the workspace, not in the checkpoint")
            continue
        kind = row[1]
        if kind == "h":  # a hard link: its first path's file
            row = rows.get(str(row[4])) or row
        if _KINDS.get(str(kind)) != n.kind:
            bad(path, f"a {n.kind} in the workspace, kind {kind!r} in the checkpoint")
            continue
        if (
            times
            and n.kind == "file"
            and n.mtime_ns is not None
            and abs(n.mtime_ns - int(row[5] or 0)) > RESTORED_NS
        ):
            # A restore sets a file's time from the manifest: a wrong one is restored.
            bad(path, f"mtime {n.mtime_ns}; the checkpoint says {row[5]}")
        if n.kind == "symlink":
            if row[4] != n.target:
                bad(path, f"symlink to {n.target!r}; the checkpoint says {row[4]!r}")
        else:
            if n.mode != row[2]:
                bad(path, f"mode {n.mode:o}; the checkpoint says {int(row[2] or 0):o}")
            if n.kind == "file":
                sha = hashlib.sha256(n.data or b"").hexdigest()
                if sha != row[4]:
                    bad(path, f"content sha256 {sha[:12]}; the checkpoint says {str(row[4])[:12]}")
                elif n.size != row[3]:
                    bad(path, f"{n.size} bytes; the checkpoint says {row[3]}")
    return judge(out, f"{len(rows)} paths as checkpoint {last.id[:24]}...", verified=len(rows))
