"""Conformance: a deleted Space is reported gone, never as a command failure."""

from __future__ import annotations

import asyncio

import pytest

from durable_spaces.errors import SpaceGoneError, SpaceUnavailableError
from durable_spaces.space import ExecState, Space, SpaceBackend

EPOCH = 1  # as in conftest.py


async def test_deleted_space_is_gone(backend: SpaceBackend, space: Space) -> None:
    await space.write_file("f", b"x", epoch=EPOCH)
    await space.exec(["true"], key="c:1:0@1", epoch=EPOCH)
    ex = await space.spawn(["sleep", "30"], key="c:2:0@1", epoch=EPOCH)
    waiter = asyncio.create_task(ex.wait())
    await asyncio.sleep(0.2)
    await backend.delete(space.name)
    with pytest.raises(SpaceUnavailableError):  # SpaceGoneError is one
        await asyncio.wait_for(waiter, 30)
    assert await backend.find(space.name) is None
    assert space.name not in await backend.names()
    for call in (
        space.exec(["true"], key=None, epoch=EPOCH),
        space.exec(["true"], key="c:3:0@1", epoch=EPOCH),
        space.exec_record("c:1:0@1"),
        space.read_file("f"),
        space.write_file("g", b"y", epoch=EPOCH),
        space.scan(),
        space.current_epoch(),
        space.advance_epoch(5),
    ):
        with pytest.raises(SpaceGoneError):
            await call
    await backend.delete(space.name)  # missing is not an error
    # The same name placed again is a new, empty instance.
    fresh = await backend.create(space.name)
    assert fresh.instance_id != space.instance_id
    assert await fresh.list_dir() == []
    assert (await fresh.exec_record("c:1:0@1")).state is ExecState.UNKNOWN
    assert await fresh.current_epoch() == 0
    with pytest.raises(SpaceGoneError):  # the old handle does not see the new instance
        await space.read_file("f")
