"""A whole-machine Space (microvm) whose machine crashes and boots again while a driver
runs: nothing fails (the daemon comes back and answers), but writes that had not reached
the guest's disk are gone. Found by a microvm campaign (seed mv1130-10): the driver went
on and checkpointed a journal whose last append had become a run of NULs. The adapter
now checks the guest's boot id before each commit that vouches for the machine's state;
the next driver restores the last checkpoint taken before the restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from needs import need

from durable_spaces.adapter.checkpoints.snapshots import SandboxSnapshots
from durable_spaces.adapter.durable import durable_spaces
from durable_spaces.adapter.space_state import DOC, SpaceState
from durable_spaces.backends import open_backend
from durable_spaces.errors import SpaceUnavailableError
from durable_spaces.harness.log import MemoryStorage
from durable_spaces.harness.models import ScriptedModel
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry
from tests.adapter.drive import Attempt, drive, setup, trace_shows

pytestmark = [pytest.mark.microvm, pytest.mark.slow]


def _need_microvm() -> None:
    need("microvm")


async def test_a_commit_after_a_machine_restart_halts_and_the_next_driver_restores(
    tmp_path: Path,
) -> None:
    _need_microvm()
    backend = open_backend("microvm", tmp_path / "spaces")
    storage = MemoryStorage()

    def adapter(epoch: int):  # type: ignore[no-untyped-def]
        return durable_spaces(
            backend, snapshots=SandboxSnapshots(backend), mode="checkpoint", epoch=epoch
        )

    durable = adapter(1)
    reg = Registry().install(CodingTools).install(durable.extension)
    h = await Harness.open(
        storage, models={"s": ScriptedModel(5, 3)}, registry=reg, env=durable.env
    )
    try:
        root = await h.root(AgentConfig(model="s"))
        assert (await (await root.submit("go", request_id="r1")).wait()).status == "done"
        state = SpaceState.from_json(root.document(DOC))
        assert state.last_checkpoint is not None
        space = await durable.space(root.id)
        await durable.parts.boot.require_same(space)  # the same machine: no complaint
        await backend.restart(space.name)  # type: ignore[attr-defined]
        with pytest.raises(SpaceUnavailableError, match="booted again"):
            await durable.parts.boot.require_same(space)
        # The checkpoint of the rebooted machine is taken but never committed.
        rec = next(iter(state.calls.values()))
        with pytest.raises(SpaceUnavailableError, match="booted again"):
            await durable.take_checkpoint(h, root.id, rec, space)
        assert SpaceState.from_json(root.document(DOC)).last_checkpoint == state.last_checkpoint
    finally:
        await h.close()

    # The next driver: the boot id differs from the log's, so it restores the newest
    # recorded checkpoint (a machine image from before the restart) and then agrees.
    durable = adapter(2)
    reg = Registry().install(CodingTools).install(durable.extension)
    h = await Harness.open(
        storage, models={"s": ScriptedModel(5, 3)}, registry=reg, env=durable.env
    )
    try:
        await durable.ensure_space(h, root.id)
        assert [e.kind for e in durable.events] == ["restored"]
        space = await durable.space(root.id)
        await durable.parts.boot.require_same(space)
    finally:
        await h.close()
        for name in await backend.names():
            await backend.delete(name)
        await backend.close()


def _restart_machine_after(point: str):  # type: ignore[no-untyped-def]
    """While the driver runs: once the trace shows ``point``, crash-restart the Space's
    machine (QEMU killed, the disk booted again), as the campaigns' space_restart does."""

    async def fault(tmp: Path, trace: Path) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while loop.time() < deadline:
            if trace_shows(trace, point):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"the driver never reached {point}")
        b = open_backend("microvm", tmp / "spaces")
        try:
            (name,) = await b.names()
            await b.restart(name)
        finally:
            await b.close()

    return fault


def test_machine_restarted_under_a_running_driver_is_not_committed(tmp_path: Path) -> None:
    """Found by a microvm campaign (seed mv1130-10): a machine restart between two calls
    failed nothing (the daemon came back), so the driver went on and checkpointed a disk
    that had lost an append (a line of NULs). Now the commit after it halts, and the next
    driver restores the last checkpoint taken before the restart."""
    _need_microvm()
    setup(tmp_path, "microvm", "checkpoint", calls=5, sleep=0.0, seed="1", snapshots="sandbox")
    o = drive(
        tmp_path,
        [Attempt(during=_restart_machine_after("harness.tool_result 2")), Attempt()],
        backend="microvm",
    )
    assert o.codes[0] == 1, (o.codes, o.stderr)  # halted: the machine booted again
    assert "booted again" in o.stderr[0] or "unavailable" in o.stderr[0], o.stderr[0]
    assert o.codes[-1] == 0, o.stderr
    assert "restored" in [e.get("event") for e in o.events] or "restored" in o.kinds()
    assert o.valid, o.verdicts
