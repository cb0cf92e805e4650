"""A host that lost power: the log kept fewer commits than the Space acted on (the
Space is *ahead* of the log). Made here without a FUSE layer, exactly: the log file of
an earlier moment is put back (what SQLite ``NORMAL`` may leave after a power cut) and
the host's boot id changes (``DS_HOST_BOOT_ID``, ``durable_spaces/host/boot.py``). The
next driver must bring the workspace back to what the log implies (transactional: the
image; checkpoint: the newest recorded checkpoint), so the calls the log forgot run
again exactly once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
from durable_spaces.adapter.space_state import DOC, SpaceState
from durable_spaces.backends import open_backend
from durable_spaces.harness.log import SqliteStorage
from durable_spaces.harness.models import ScriptedModel
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.host.boot import BOOT_ENV, read_host_boot_id
from durable_spaces.settings import Settings

SEED = "power-3"  # steps 0-2 and 3-5 each hold a bash call


def _files(spaces: Path) -> dict[str, bytes]:
    (work,) = spaces.glob("*/work")
    return {str(p.relative_to(work)): p.read_bytes() for p in work.rglob("*") if p.is_file()}


class Host:
    def __init__(self, tmp: Path, mode: str) -> None:
        self.tmp = tmp
        self.mode = mode
        self.log = tmp / "log.sqlite"
        self.backend = open_backend("local", tmp / "spaces")
        self.store = DirectoryCheckpointStore(tmp / "store")

    def adapter(self, epoch: int) -> DurableSpaces:
        snaps = WorkspaceSnapshots(self.backend, store=self.store)
        return durable_spaces(self.backend, snapshots=snaps, mode=self.mode, epoch=epoch)  # type: ignore[arg-type]

    async def submit(self, epoch: int, request: str, steps: int) -> DurableSpaces:
        durable = self.adapter(epoch)
        reg = Registry().install(CodingTools).install(durable.extension)
        storage = SqliteStorage(str(self.log), synchronous="FULL")
        h = await Harness.open(
            storage,
            models={"s": ScriptedModel(SEED, steps)},
            registry=reg,
            env=durable.env,
        )
        try:
            root = await h.root(AgentConfig(model="s"))
            if steps:
                done = await (await root.submit(request, request_id=request)).wait()
                assert done.status == "done"
            else:
                await durable.ensure_space(h, root.id)
            self.state = SpaceState.from_json(root.document(DOC))
        finally:
            await h.close()
            storage.close()
        return durable


@pytest.mark.parametrize(
    ("mode", "kind"), [("transactional", "reverted"), ("checkpoint", "restored")]
)
async def test_a_space_ahead_of_a_rolled_back_log_is_brought_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, kind: str
) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-a\n")
    monkeypatch.setenv(BOOT_ENV, str(boot))
    host = Host(tmp_path, mode)
    await host.submit(1, "first", 3)
    assert host.state.boot == "boot-a"  # the log knows which boot it committed on
    kept = _files(tmp_path / "spaces")
    shutil.copy(host.log, tmp_path / "log.kept")  # what a power cut leaves of the log
    await host.submit(2, "second", 6)  # three more calls change the Space
    ahead = _files(tmp_path / "spaces")
    assert ahead != kept
    lost_top = host.state.marks

    # Power loss: the log's tail is gone, the Space kept its effects, the host rebooted.
    shutil.copy(tmp_path / "log.kept", host.log)
    boot.write_text("boot-b\n")
    durable = await host.submit(3, "", 0)  # the next driver binds to the Space
    assert [e.kind for e in durable.events] == [kind]
    assert _files(tmp_path / "spaces") == kept, "the Space is still ahead of the log"
    assert host.state.boot == "boot-b"

    # The forgotten calls, asked for again, run once each: the same workspace as before.
    durable = await host.submit(4, "second", 6)
    assert _files(tmp_path / "spaces") == ahead
    # A call the log forgot, issued again with the same n (and, were the epoch source lost
    # too, the same epoch), gets a new key: its position is past every one the Space's
    # ledger knows (adapter/log_witness.py), whatever the log lost.
    keys = {int(c.split("-")[1][1:]): r for c, r in host.state.calls.items() if r.key}
    assert any(n >= 3 for n in keys), keys
    assert all(r.mark is not None and r.mark > lost_top for n, r in keys.items() if n >= 3)
    assert all((r.key or "").endswith(f"#{r.mark}") for r in keys.values())


async def test_the_same_boot_is_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-a\n")
    monkeypatch.setenv(BOOT_ENV, str(boot))
    host = Host(tmp_path, "transactional")
    await host.submit(1, "first", 3)
    durable = await host.submit(2, "", 0)
    assert durable.events == []


def test_boot_ids_are_validated(tmp_path: Path) -> None:
    f = tmp_path / "b"
    assert read_host_boot_id(f) is None  # missing
    f.write_text("two words\n")
    assert read_host_boot_id(f) is None
    f.write_text("x" * 200)
    assert read_host_boot_id(f) is None
    f.write_text("abc-123\n")
    assert read_host_boot_id(f) == "abc-123"
    assert Settings.from_env({BOOT_ENV: str(f)}).host_boot_id == f
    assert read_host_boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
