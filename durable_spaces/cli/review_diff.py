"""``durable-spaces diff``'s work: open a session's log and its backend, diff two entries
(``open_session`` also serves ``durable-spaces quarantine``).

The CLI's half of ``durable_spaces/adapter/review.py``: it opens a backend by name, which
the adapter itself never does (the adapter takes Spaces it is given).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from durable_spaces.adapter.checkpoints.snapshots import WorkspaceSnapshots
from durable_spaces.adapter.review import diff_entries, render
from durable_spaces.errors import ReviewError
from durable_spaces.host.bounded import load_object

if TYPE_CHECKING:
    from durable_spaces.adapter.durable import DurableSpaces
    from durable_spaces.harness.scheduler import Harness


def review_diff_main(
    state_dir: str | Path,
    backend: str | None,
    backend_dir: str | Path | None,
    from_entry: str,
    to_entry: str,
    *,
    store_dir: str | Path | None = None,
    conversation_id: str | None = None,
) -> str:
    """``durable-spaces diff``: the workspace diff between two entries of the log in
    ``state_dir`` (opened shared, never written, so a running driver is not disturbed),
    as text for the caller to print.

    ``backend``, ``backend_dir`` and ``store_dir`` left None are read from
    ``state_dir/agent.json`` when the campaign wrote one. The conversation defaults to
    the deepest one that sees both entries. Raises ``ReviewError`` with the reason."""
    return asyncio.run(
        _review_diff(
            Path(state_dir),
            backend,
            backend_dir,
            from_entry,
            to_entry,
            store_dir,
            conversation_id,
        )
    )


async def _review_diff(
    state_dir: Path,
    backend: str | None,
    backend_dir: str | Path | None,
    from_entry: str,
    to_entry: str,
    store_dir: str | Path | None,
    conversation_id: str | None,
) -> str:
    async with open_session(state_dir, backend, backend_dir, store_dir) as (harness, durable):
        conv = conversation_id or _conversation_seeing(harness, from_entry, to_entry)
        diffs = await diff_entries(harness, durable, conv, from_entry, to_entry)
        return render(diffs)


@asynccontextmanager
async def open_session(
    state_dir: Path,
    backend: str | None,
    backend_dir: str | Path | None,
    store_dir: str | Path | None,
) -> AsyncIterator[tuple[Harness, DurableSpaces]]:
    """A session's log (``log.sqlite``, else ``log.jsonl``) opened shared and never
    written by a commit, with an adapter on its backend and store (left None: as the
    campaign's ``agent.json`` says), for review; ``ReviewError`` when they cannot be
    found."""
    from durable_spaces.adapter.checkpoints.snapshots import DirectoryCheckpointStore
    from durable_spaces.adapter.durable import durable_spaces
    from durable_spaces.backends import open_backend
    from durable_spaces.drive.entry import JSONL_LOG_FILE, LOG_FILE
    from durable_spaces.harness.log import JsonlStorage, SqliteStorage, Storage
    from durable_spaces.harness.scheduler import Harness
    from durable_spaces.harness.tools import Registry

    log_path = state_dir / LOG_FILE
    jsonl = not log_path.exists() and (state_dir / JSONL_LOG_FILE).exists()
    if jsonl:
        log_path = state_dir / JSONL_LOG_FILE
    if not log_path.exists():
        raise ReviewError(f"no log at {log_path}")
    saved = _agent_json(state_dir)
    backend = backend or saved.get("backend")
    backend_dir = backend_dir or saved.get("backend_dir")
    store_dir = store_dir or saved.get("store_dir")
    if not backend or not backend_dir:
        raise ReviewError(
            f"which backend holds the Spaces? pass backend and backend_dir ({state_dir} has "
            "no agent.json that says)"
        )
    spaces = open_backend(backend, backend_dir)
    storage: Storage
    try:
        if jsonl:
            storage = JsonlStorage(log_path, exclusive=False)
        else:
            storage = SqliteStorage(log_path, exclusive=False)
    except BaseException:
        await spaces.close()
        raise
    try:
        harness = await Harness.open(storage, models={}, registry=Registry())
        store = (
            DirectoryCheckpointStore(store_dir) if store_dir and Path(store_dir).is_dir() else None
        )
        durable = durable_spaces(spaces, snapshots=WorkspaceSnapshots(spaces, store=store), epoch=1)
        durable.bind_log(harness.log_id)
        yield harness, durable
    finally:
        storage.close()
        await spaces.close()


def _agent_json(state_dir: Path) -> dict[str, str]:
    """backend, backend_dir and store_dir as the campaign's agent.json records them."""
    try:
        saved = load_object(state_dir / "agent.json")
    except (OSError, ValueError):  # BadFileError (a FIFO, too big, too deep) is one
        return {}
    if not isinstance(saved, dict):
        return {}
    keys = ("backend", "backend_dir", "store_dir")
    return {k: str(saved[k]) for k in keys if saved.get(k)}


def _conversation_seeing(harness: Harness, *entry_ids: str) -> str:
    """The conversation in which every entry is visible (the deepest such one)."""
    for eid in entry_ids:
        try:
            harness.entry(eid)
        except KeyError:
            raise ReviewError(f"no entry {eid!r} in the log") from None
    for eid in reversed(entry_ids):
        cid = harness.entry(eid).conversation_id
        visible = {e.id for e in harness.conversation(cid).entries()}
        if all(x in visible for x in entry_ids):
            return cid
    raise ReviewError(f"no conversation sees all of {', '.join(entry_ids)}")
