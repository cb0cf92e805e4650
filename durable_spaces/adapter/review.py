"""Review what an agent changed: the workspace as of any entry, and diffs between entries.

Why it can be answered from the log alone: every wrapped call commits its effect on the
workspace before its result entry. In transactional mode that is the image (the
rewindable path table ``cua.space.image`` plus blobs stored once as ``cua.blob/<sha>``);
in checkpoint mode it is the id of a tar of the workspace recorded in the rewindable
``cua.space`` document. So reading those documents *as of* an entry gives exactly the
workspace the committed transcript implies at that point, for any conversation and its
forks (an inherited entry is read in the parent, blobs are looked up through ancestors).

What it does not show: changes made outside the wrapped calls after the last call up to
that entry (transactional mode commits them with the *next* call's start mark), and
anything before the first wrapped call (the log holds nothing yet: the workspace is
``{}``). Modes and owners of files are not compared; empty directories are not tracked.

Checkpoint tars are read from the ``CheckpointStore`` when there is one, else from the
``.ds-checkpoints`` directory of the Space that took them (a read-only command at the
Space's current epoch, never raising it); the first copy whose bytes match the digest its
id records wins. Machine checkpoints (microVM) hold no
readable workspace: reviewing them raises ``ReviewError``.

Symlinks appear in the returned mapping as ``SYMLINK + target`` so a path that turned
from a file into a link (or changed target) shows up in a diff like any other change.

Beside the workspace as of an entry, what recovery kept aside: ``quarantines`` lists the
quarantine checkpoints of a conversation (what a revert or restore would have deleted
that nothing else held, ``quarantine.py``) and ``quarantined`` reads one's workspace,
from the same copies a checkpoint is read from.
"""

from __future__ import annotations

import difflib
import io
import posixpath
import tarfile
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Literal, NamedTuple

from durable_spaces.adapter.checkpoints.snapshots import (
    CheckpointMissing,
    WorkspaceSnapshots,
    check_archive,
)
from durable_spaces.adapter.quarantine import Kept, records
from durable_spaces.adapter.space_state import DOC, IMAGE_DOC, SpaceState
from durable_spaces.errors import PermanentFailure, ReviewError
from durable_spaces.space import PathTable, Space

if TYPE_CHECKING:
    from durable_spaces.adapter.durable import DurableSpaces
    from durable_spaces.harness.scheduler import AgentConfig, Conversation, Harness

#: A workspace: workspace-relative path -> file bytes (``SYMLINK + target`` for a link).
WorkspaceFiles = dict[str, bytes]

#: Prefix of a symlink's value in a ``WorkspaceFiles`` (no text file starts with a NUL byte).
SYMLINK = b"\x00symlink\x00"

Status = Literal["added", "removed", "modified"]

__all__ = [
    "SYMLINK",
    "FileDiff",
    "Kept",
    "ReviewError",
    "WorkspaceFiles",
    "diff_entries",
    "diff_workspaces",
    "entry_before",
    "fork_at",
    "quarantined",
    "quarantines",
    "render",
    "state_before",
    "workspace_at",
    "workspace_from_tar",
]


class FileDiff(NamedTuple):
    """One changed path between two entries: ``diff`` is unified diff text (or a note for
    binary content)."""

    path: str
    status: Status
    diff: str


# --- the workspace as of an entry ---------------------------------------------------------


async def workspace_at(
    harness: Harness, durable: DurableSpaces, conversation_id: str, entry_id: str
) -> WorkspaceFiles:
    """The workspace the committed log implies right after entry ``entry_id`` (an entry
    visible in ``conversation_id``: its own or one inherited from a parent)."""
    try:
        conv = harness.conversation(conversation_id)
        raw = conv.document(DOC, as_of=entry_id)
    except KeyError as e:
        raise ReviewError(str(e.args[0] if e.args else e)) from None
    try:
        state = SpaceState.from_json(raw)  # checkpoint ids parsed: the log may be damaged
    except PermanentFailure as e:
        raise ReviewError(f"the log as of {entry_id} cannot be read: {e}") from None
    pointer = conv.document(IMAGE_DOC, as_of=entry_id)
    if state.mode == "checkpoint" and state.last_checkpoint is not None:
        data = await _checkpoint_bytes(
            harness, durable, conversation_id, state, state.last_checkpoint
        )
        return workspace_from_tar(data)
    if state.image_stale is not None:
        raise ReviewError(
            f"the image as of {entry_id} is stale ({state.image_stale}): the log does not "
            "know the workspace there"
        )
    if pointer is None:
        return {}  # no wrapped call had committed an effect yet
    table = durable.image_table(harness, conversation_id, as_of=entry_id)
    return _workspace_from_image(harness, durable, conversation_id, table)


def _workspace_from_image(
    harness: Harness,
    durable: DurableSpaces,
    conversation_id: str,
    table: PathTable,
) -> WorkspaceFiles:
    out: WorkspaceFiles = {}
    for path, entry in sorted(table.items()):
        if entry.kind == "symlink":
            out[path] = SYMLINK + (entry.target or "").encode()
            continue
        assert entry.sha256 is not None
        blob = durable.blob(harness, conversation_id, entry.sha256)
        if blob is None:
            raise ReviewError(f"the image refers to blob {entry.sha256} that the log lacks")
        out[path] = blob
    return out


def workspace_from_tar(data: bytes) -> WorkspaceFiles:
    """The files and symlinks of a workspace checkpoint (checked like a restore would)."""
    check_archive(data)
    out: WorkspaceFiles = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar.getmembers():
            path = posixpath.normpath(m.name)
            if path == ".":
                continue
            if m.issym():
                out[path] = SYMLINK + m.linkname.encode()
            elif m.isfile():
                f = tar.extractfile(m)
                out[path] = f.read() if f is not None else b""
    return dict(sorted(out.items()))


def quarantines(harness: Harness, conversation_id: str) -> list[Kept]:
    """The conversation's quarantine checkpoints, oldest first: each says when, why, in
    which Space, and the first paths it keeps that nothing else held."""
    try:
        return records(harness, conversation_id)
    except KeyError as e:
        raise ReviewError(str(e.args[0] if e.args else e)) from None
    except PermanentFailure as e:
        raise ReviewError(str(e)) from None


async def quarantined(
    harness: Harness, durable: DurableSpaces, conversation_id: str, checkpoint_id: str
) -> WorkspaceFiles:
    """The workspace a quarantine checkpoint of the conversation keeps (all of it, as it
    was before the take-back: the paths at risk are in ``quarantines``)."""
    kept = {k.checkpoint: k for k in quarantines(harness, conversation_id)}
    if checkpoint_id not in kept:
        raise ReviewError(f"{checkpoint_id!r} is not a quarantine of {conversation_id!r}")
    state = SpaceState.from_json(harness.conversation(conversation_id).document(DOC))
    state.space = kept[checkpoint_id].space  # the Space that kept it, first
    data = await _checkpoint_bytes(harness, durable, conversation_id, state, checkpoint_id)
    return workspace_from_tar(data)


async def _checkpoint_bytes(
    harness: Harness,
    durable: DurableSpaces,
    conversation_id: str,
    state: SpaceState,
    cid: str,
) -> bytes:
    durable.bind_log(harness.log_id)  # Spaces are named by it
    snaps = durable.snapshots
    if not isinstance(snaps, WorkspaceSnapshots):
        raise ReviewError(
            f"checkpoint {cid} is a machine checkpoint: it holds no readable workspace"
        )
    # The store's copy, else the tar beside the workspace of the Space that took it: the
    # one the document names, else this conversation's or an ancestor's (a fork's
    # copied checkpoints). Each copy is verified against the id's digest.

    async def spaces() -> AsyncIterator[Space]:  # found only if the store has no copy
        for name in _candidate_spaces(harness, durable, conversation_id, state):
            space = await durable.spaces.find(name)
            if space is not None:
                yield space

    try:
        return await snaps.read_intact(cid, spaces())
    except CheckpointMissing:
        raise ReviewError(
            f"checkpoint {cid} is in neither the store nor any Space of the lineage"
        ) from None
    except PermanentFailure as e:
        raise ReviewError(str(e)) from None


def _candidate_spaces(
    harness: Harness, durable: DurableSpaces, conversation_id: str, state: SpaceState
) -> list[str]:
    names: list[str] = []
    if state.space:
        names.append(state.space)
    cid: str | None = conversation_id
    while cid is not None:
        conv = harness.conversation(cid)
        latest = SpaceState.from_json(conv.document(DOC))
        for name in (latest.space, durable.name_for(cid)):
            if name and name not in names:
                names.append(name)
        cid = conv.parent_id
    return names


# --- diffs and the state before a decision -------------------------------------------------


def diff_workspaces(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> list[FileDiff]:
    """Per changed path (sorted): added / removed / modified, with a unified diff."""
    out: list[FileDiff] = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        status: Status = "added" if a is None else "removed" if b is None else "modified"
        out.append(FileDiff(path, status, _unified(path, a, b)))
    return out


def _unified(path: str, a: bytes | None, b: bytes | None) -> str:
    old, new = _text(a), _text(b)
    if old is None or new is None:
        return f"Binary files a/{path} and b/{path} differ\n"
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile="/dev/null" if a is None else f"a/{path}",
        tofile="/dev/null" if b is None else f"b/{path}",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def _text(data: bytes | None) -> str | None:
    if data is None:
        return ""
    if data.startswith(SYMLINK):
        return "symlink -> " + data[len(SYMLINK) :].decode(errors="replace") + "\n"
    if b"\x00" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


async def diff_entries(
    harness: Harness,
    durable: DurableSpaces,
    conversation_id: str,
    from_entry: str,
    to_entry: str,
) -> list[FileDiff]:
    """What changed in the workspace between two entries of one conversation."""
    before = await workspace_at(harness, durable, conversation_id, from_entry)
    after = await workspace_at(harness, durable, conversation_id, to_entry)
    return diff_workspaces(before, after)


def entry_before(harness: Harness, conversation_id: str, entry_id: str) -> str | None:
    """The visible entry just before ``entry_id`` (None if it is the first)."""
    ids = [e.id for e in harness.conversation(conversation_id).entries()]
    if entry_id not in ids:
        raise ReviewError(f"entry {entry_id!r} is not visible in {conversation_id!r}")
    i = ids.index(entry_id)
    return ids[i - 1] if i > 0 else None


async def state_before(
    harness: Harness, durable: DurableSpaces, conversation_id: str, entry_id: str
) -> WorkspaceFiles:
    """The workspace the agent saw when it made decision ``entry_id`` (an assistant
    entry): the workspace as of the entry before it."""
    prev = entry_before(harness, conversation_id, entry_id)
    if prev is None:
        return {}
    return await workspace_at(harness, durable, conversation_id, prev)


async def fork_at(
    harness: Harness,
    durable: DurableSpaces,
    conversation_id: str,
    entry_id: str,
    agent: AgentConfig | None = None,
) -> Conversation:
    """Fork at ``entry_id`` to continue by hand: the fork sees the transcript up to the
    entry, and its own Space is built now (from the image or checkpoint recorded as of
    the entry) rather than at its first call, so it can be inspected before anything runs.
    """
    fork = await harness.conversation(conversation_id).fork(entry_id, agent)
    await durable.ensure_space(harness, fork.id)
    return fork


def render(diffs: list[FileDiff]) -> str:
    """The diffs as one text: a summary line per path, then the unified diffs."""
    if not diffs:
        return "no changes\n"
    head = "".join(f"{d.status[0].upper()} {d.path}\n" for d in diffs)
    return head + "\n" + "".join(d.diff for d in diffs)
