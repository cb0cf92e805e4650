"""A harness with the adapter's wrapped tools on a real backend, for tests that script a
list of calls (``tests/adapter/test_image_reads.py``, ``tests/inputs/test_tool_inputs.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
from durable_spaces.backends import open_backend
from durable_spaces.harness.log import SqliteStorage
from durable_spaces.harness.scheduler import Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.testing import CallListModel


@asynccontextmanager
async def wrapped_harness(
    tmp: Path, backend: str, mode: str, calls: Sequence[tuple[str, Any]], **options: Any
) -> AsyncIterator[tuple[Harness, DurableSpaces]]:
    """The harness (model ``m`` plays ``calls``) and the adapter (with ``durable_spaces``'s
    further ``options``), on ``tmp``; every Space it made is deleted afterwards."""
    spaces = open_backend(backend, tmp / "spaces")
    snaps = WorkspaceSnapshots(spaces, store=DirectoryCheckpointStore(tmp / "store"))
    durable = durable_spaces(
        spaces, snapshots=snaps, mode=mode, epoch=1, namespace=tmp.name, **options
    )
    reg = Registry().install(CodingTools).install(durable.extension)
    storage = SqliteStorage(tmp / "log.sqlite")
    h = await Harness.open(
        storage, models={"m": CallListModel(list(calls))}, registry=reg, env=durable.env
    )
    try:
        yield h, durable
    finally:
        await h.close()
        storage.close()
        for n in await spaces.names():
            await spaces.delete(n)
        await spaces.close()
