"""Checkpoint runs: every committed call is in the checkpoint recorded for it
(``call_not_in_checkpoint``), as ``image_follows_calls`` asks of the transactional image.

Why a check of its own: ``checkpoint_equals_workspace`` reads the last checkpoint only.
A call whose checkpoint misses its change (a journal that lost an event, a listing that
trusted a stale look: the mutant ``checkpoint_misses_call``) is healed by the next call's
checkpoint, which looks again; the end agrees, and only a restore in between (a crash of
the next call) would bring back a workspace without the change the log says was made.
This check reads the checkpoint recorded for each call, not only the last.

What it reads: the ``cua.space`` document as each commit left it (the raw log), so that a
call's checkpoint is the one recorded with or after its first ``ok`` result (a later
retake by recovery does not stand for it); each recorded checkpoint's manifest from the
run's checkpoint store (the adapter keeps every one there; the Space's copies are pruned),
else the Space's copy on this host, checked against the sha256 its id names and decoded
here (``checks.checkpoint``'s reading, not the adapter's). Compared: for each file the
checker's interpreter (``checks.workload``) says the call left, the manifest's file (a
hard link as its first path's) with the sha256 of that content.

Not checked, with the reason counted: a mode other than ``checkpoint`` for the call, a
machine checkpoint (no manifest), a ``server`` run (its process writes between calls),
a call whose checkpoint was never recorded (an interrupted one keeps the one before it),
a checkpoint the Space's copy lacks when no store was given (a Space placed again holds
none of the earlier ones). With a store (every campaign run has one), a recorded
checkpoint in neither place is an anomaly: the store keeps every one.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from durable_spaces.campaigns.checks.checkpoint import (
    COPY_DIR,
    DOC,
    MANIFEST_ID,
    ServerWorkload,
    _entries,
    _manifest_part,
    _read_host,
)
from durable_spaces.campaigns.checks.history import History
from durable_spaces.campaigns.checks.verdict import Anomaly, Verdict, anomaly, judge, passed
from durable_spaces.campaigns.checks.workspace import HOST_KINDS

if TYPE_CHECKING:
    from durable_spaces.campaigns.checks.workload import Implied
    from durable_spaces.space import Space

#: At most this many manifests are read for one run (a run of 10k calls records as many;
#: beyond this the rest are counted as not read, never a crash of the checker).
MAX_MANIFESTS = 20_000


@dataclass(frozen=True)
class Manifests:
    """The manifests of the checkpoints a run's log recorded: id -> bytes as read (a
    store's file cut to its manifest), and id -> why it could not be read."""

    data: Mapping[str, bytes]
    unread: Mapping[str, str]
    #: Whether a checkpoint store was read: it keeps every checkpoint, so one recorded
    #: and in neither it nor the Space's copy is lost; without one, the copies of a Space
    #: placed again (or a Space checked elsewhere) may lack the earlier ones: not known.
    store: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"unread": dict(self.unread), "read": sorted(self.data)}


def recorded_ids(history: History) -> list[str]:
    """Every checkpoint id a ``cua.space`` document of the root conversation recorded for
    a call, in the order first seen."""
    out: dict[str, None] = {}
    for _seq, state in _states(history):
        for rec in _calls(state).values():
            cid = rec.get("checkpoint")
            if isinstance(cid, str):
                out.setdefault(cid, None)
    return list(out)


def _states(history: History) -> list[tuple[int, Mapping[str, Any]]]:
    """(commit seq, the ``cua.space`` document it wrote) for each commit that wrote it."""
    out = []
    for c in history.commits:
        for op in c.ops:
            if (
                op.get("conversation_id") == history.conversation
                and op.get("op") == "doc"
                and op.get("name") == DOC
                and isinstance(op.get("value"), Mapping)
            ):
                out.append((c.seq, op["value"]))
    return out


def _calls(state: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    calls = state.get("calls")
    if not isinstance(calls, Mapping):
        return {}
    return {str(k): v for k, v in calls.items() if isinstance(v, Mapping)}


async def read_all(
    space: Space, kind: str, history: History, store: str | os.PathLike[str] | None
) -> Manifests:
    """The manifest of every checkpoint recorded for a call: from ``store``, else the
    Space's copy where its workspace is a directory on this host."""
    data: dict[str, bytes] = {}
    unread: dict[str, str] = {}
    copies = posixpath.join(posixpath.dirname(space.root.rstrip("/")), COPY_DIR)
    host = kind in HOST_KINDS and os.path.isdir(space.root)
    for n, cid in enumerate(recorded_ids(history)):
        if not MANIFEST_ID.fullmatch(cid):
            unread[cid] = "not a manifest checkpoint id"
            continue
        if n >= MAX_MANIFESTS:
            unread[cid] = f"over {MAX_MANIFESTS} checkpoints: not read"
            continue
        name = cid + ".manifest"
        why = "no store was given to look in"
        if store is not None:
            raw, why = _read_host(os.path.join(os.fspath(store), name))
            if raw is not None:
                data[cid] = _manifest_part(raw)
                continue
        if host:
            raw, why_copy = _read_host(posixpath.join(copies, name))
            if raw is not None:
                data[cid] = raw
                continue
            why = f"{why}; {why_copy}"
        unread[cid] = why
    return Manifests(data, unread, store is not None)


class _CallInputs(Protocol):
    """What this check reads of a run (``inputs.Inputs``): a protocol, so this module does
    not import the inputs that import it."""

    @property
    def history(self) -> History: ...

    @property
    def workload(self) -> ServerWorkload | None: ...

    @property
    def manifests(self) -> Manifests | None: ...

    @property
    def implied(self) -> Implied: ...


def checkpoint_follows_calls(inputs: _CallInputs) -> Verdict:
    """Checkpoint runs: at each committed ``ok`` call's result, the checkpoint recorded
    for it holds every file the call changed as the interpreter says it left it
    (module doc), anomaly ``call_not_in_checkpoint``."""
    history = inputs.history
    if inputs.workload is not None and inputs.workload.server:
        return passed("a server run: its process writes between calls")
    manifests = inputs.manifests
    if manifests is None:
        return passed("no checkpoint manifests were read (not a checkpoint run, or kept without)")
    left: dict[str, list[tuple[str, str]]] = {}  # call -> [(path, content right after it)]
    for path, versions in inputs.implied.versions.items():
        for v in versions:
            left.setdefault(v.call, []).append((path, v.content))
    ok_at: dict[str, int] = {}  # call -> its first result's commit, if that was ok
    for r in history.results:
        call = str(r.get("call_id"))
        if r.get("status") == "ok" and call in left and call not in ok_at:
            ok_at[call] = history.result_seq.get(call, 0)
    out: list[Anomaly] = []
    checked = machine = unknown = 0
    pending = dict(ok_at)
    decoded: dict[str, dict[str, list[Any]] | str] = {}
    state: Mapping[str, Any] = {}
    written = dict(_states(history))  # commit seq -> the document it wrote (the last)
    for c in history.commits:
        seq = c.seq
        state = written.get(seq, state)  # the document as of this commit
        calls = _calls(state)
        for call, at in list(pending.items()):
            if seq < at:
                continue
            rec = calls.get(call) or {}
            cid = rec.get("checkpoint")
            if rec.get("mode") not in (None, "checkpoint"):
                del pending[call]  # kept by the image: image_follows_calls' claim
                continue
            if not isinstance(cid, str):
                continue  # not recorded yet (a commit of its own follows the result)
            del pending[call]
            rows = _rows(manifests, cid, decoded)
            if rows is None:
                machine += 1
                continue
            if cid in manifests.unread and not manifests.store:
                unknown += 1  # no store to look in, and the copy lacks it: not known
                continue
            if isinstance(rows, str):
                out.append(anomaly("call_not_in_checkpoint", f"{cid[:40]}: {rows}",
                                   witness=[call, seq]))  # fmt: skip
                continue
            checked += 1
            for path, content in left[call]:
                want = hashlib.sha256(content.encode()).hexdigest()
                row = rows.get(path)
                if row is not None and row[1] == "h":  # a hard link: its first path's file
                    row = rows.get(str(row[4])) or row
                if row is None or row[1] not in ("f", "h") or row[4] != want:
                    held = "no file" if row is None else f"sha256 {str(row[4])[:12]}"
                    out.append(anomaly(
                        "call_not_in_checkpoint",
                        f"{call}'s checkpoint {cid[:24]}... holds {held}; the call left "
                        f"{want[:12]}",
                        path=path, witness=[call, seq],
                    ))  # fmt: skip
    detail = f"{checked} committed calls each in its checkpoint"
    if machine:
        detail += f"; {machine} machine checkpoints not read"
    if unknown:
        detail += f"; {unknown} whose checkpoint the Space's copy lacks (no store given)"
    if pending:
        detail += f"; {len(pending)} without a recorded checkpoint"
    return judge(out, detail)


def _rows(
    manifests: Manifests, cid: str, memo: dict[str, dict[str, list[Any]] | str]
) -> dict[str, list[Any]] | str | None:
    """The manifest's rows by path; a string says why there are none; None: a machine
    checkpoint (no manifest to read)."""
    m = MANIFEST_ID.fullmatch(cid)
    if m is None:
        return None
    if cid in memo:
        return memo[cid]
    data = manifests.data.get(cid)
    got: dict[str, list[Any]] | str
    if data is None:
        got = f"its manifest could not be read: {manifests.unread.get(cid, 'not read')}"
    elif hashlib.sha256(data).hexdigest() != m.group(1):
        got = "the bytes read are not the manifest its id names"
    else:
        try:
            got = _entries(data)
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError) as e:
            got = f"unreadable manifest: {e}"
    memo[cid] = got
    return got
