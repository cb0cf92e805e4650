"""What knowing whose Space it is costs (``python -m bench.space_owner [--backends
local,spacesd] [--rounds 30]``).

Per backend, medians over ``--rounds``: reading a Space's owner record as a driver does
when it first binds to it (``adapter/space_owner.py``: the claims' ``exec_record``s, here
one claim and the unknown key after it), and claiming a new Space (one ``printf`` under
the next claim's key, waited for), beside a keyed ``true`` (the witness's record of a
write's position, ``adapter/log_witness.py``) as the yardstick. Then the quarantine
(``adapter/quarantine.py``): a transactional revert of a workspace of ``--files`` files
of 4 KiB that deletes only what the log holds (nothing kept) against one that deletes a
file added by hand (its quarantine checkpoint taken and recorded first).
A backend that cannot run here prints a skip line with its reason."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

from durable_spaces.adapter import space_owner
from durable_spaces.adapter.checkpoints.snapshots import WorkspaceSnapshots
from durable_spaces.adapter.durable import durable_spaces
from durable_spaces.backends import open_backend, unavailable_reason
from durable_spaces.harness.log import SqliteStorage
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.testing import CallListModel


def _ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


async def _owner(backend: Any, rounds: int) -> dict[str, float]:
    me = space_owner.Owner(uuid.uuid4().hex, "c1")
    reads, claims, trues = [], [], []
    for i in range(rounds):
        space = await backend.create(f"bench-owner-{i}")
        await space.advance_epoch(1)
        t0 = time.perf_counter()
        await space_owner.claim(space, me, 1, 1)
        claims.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert (await space_owner.read(space)).owner == me
        reads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await (await space.spawn(["true"], key=f"{me.log}:c1#1", epoch=1, cwd="/")).detach()
        trues.append(time.perf_counter() - t0)
        await backend.delete(space.name)
    return {"read": _ms(reads), "claim": _ms(claims), "keyed_true": _ms(trues)}


async def _revert(tmp: Path, name: str, files: int, rounds: int) -> dict[str, float]:
    backend = open_backend(name, tmp / "spaces")
    durable = durable_spaces(
        backend, snapshots=WorkspaceSnapshots(backend), mode="transactional", epoch=1
    )
    make = f"mkdir -p d && for i in $(seq {files}); do head -c 4096 /dev/urandom > d/f$i; done"
    model = CallListModel([("bash", {"command": make})])
    reg = Registry().install(CodingTools).install(durable.extension)
    storage = SqliteStorage(tmp / "log.sqlite")
    h = await Harness.open(storage, models={"m": model}, registry=reg, env=durable.env)
    held, kept = [], []
    try:
        root = await h.root(AgentConfig(model="m"))
        assert (await (await root.submit("go", request_id="go")).wait()).status == "done"
        space = await durable.space(root.id)
        epoch = durable.epoch_for(space.name)
        for i in range(rounds):
            await space.remove("d/f1", epoch=epoch)  # held: the log has its blob
            t0 = time.perf_counter()
            assert await durable.tx.revert(h, root.id, space) is None
            held.append(time.perf_counter() - t0)
            await space.write_file(f"by-hand-{i}.txt", os.urandom(4096), epoch=epoch)
            t0 = time.perf_counter()
            assert await durable.tx.revert(h, root.id, space) is not None
            kept.append(time.perf_counter() - t0)
    finally:
        await h.close()
        await durable.close()
        storage.close()
        for n in await backend.names():
            await backend.delete(n)
        await backend.close()
    return {"revert_held": _ms(held), "revert_kept": _ms(kept)}


async def main(backends: list[str], rounds: int, files: int) -> None:
    for name in backends:
        if why := unavailable_reason(name):
            print(f"OWNER backend={name} skipped: {why}", flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix="bench-owner-") as d:
            backend = open_backend(name, Path(d) / "spaces")
            try:
                o = await _owner(backend, rounds)
            finally:
                await backend.close()
            r = await _revert(Path(d), name, files, max(3, rounds // 5))
        print(
            f"OWNER backend={name} rounds={rounds} read_ms={o['read']:.1f} "
            f"claim_ms={o['claim']:.1f} keyed_true_ms={o['keyed_true']:.1f} "
            f"files={files} revert_held_ms={r['revert_held']:.1f} "
            f"revert_kept_ms={r['revert_kept']:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="local,spacesd")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--files", type=int, default=100)
    a = p.parse_args()
    asyncio.run(main(a.backends.split(","), a.rounds, a.files))
