"""A log that lost its tail while this host never rebooted: a log on a
shared mount, or on another host, loses its unsynced commits; the Space kept every
effect. The host's boot id is the same, so only ``adapter/log_witness.py``'s witness
(the Space's exec ledger knows a log position the log never reached) shows the Space is
ahead. Made here exactly, without a FUSE layer: the log file of an earlier moment is put
back (what SQLite ``NORMAL`` may leave after its storage lost power), the boot id kept.
The next driver must bring the workspace back to what the log implies (transactional:
the image; checkpoint: the newest recorded checkpoint), so the calls the log forgot run
again exactly once (``log.txt`` is appended to by bash calls: a rerun shows as a
duplicate line). The same run through the lab's powerfs is ``tests/campaigns/
test_log_loss.py``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from durable_spaces.adapter import log_witness
from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
from durable_spaces.adapter.log_witness import LogWitness
from durable_spaces.adapter.space_state import DOC, CallRecord, SpaceState
from durable_spaces.backends import open_backend, unavailable_reason
from durable_spaces.errors import PermanentFailure
from durable_spaces.harness.log import SqliteStorage
from durable_spaces.harness.models import ScriptedModel
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.host.boot import BOOT_ENV
from durable_spaces.space import ExecState, SpaceBackend

LOG = "0123456789abcdef" * 2  # a log's identity (``Storage.identity``)
SEED = "power-3"  # steps 0-2 and 3-5 each hold a bash call (tests/adapter/test_power_loss.py)
BACKENDS = ["local", pytest.param("spacesd", marks=pytest.mark.spacesd)]


async def _files(backend: SpaceBackend) -> dict[str, bytes]:
    """Every file of the one Space's workspace, read through the Space."""
    (name,) = await backend.names()
    space = await backend.find(name)
    assert space is not None
    table = await space.scan(".")
    return {p: await space.read_file(p) for p, e in sorted(table.items()) if e.kind == "file"}


class Host:
    def __init__(self, tmp: Path, mode: str, backend: str) -> None:
        self.tmp = tmp
        self.mode = mode
        self.log = tmp / "log.sqlite"
        self.backend = open_backend(backend, tmp / "spaces")
        self.store = DirectoryCheckpointStore(tmp / "store")

    def adapter(self, epoch: int) -> DurableSpaces:
        snaps = WorkspaceSnapshots(self.backend, store=self.store)
        return durable_spaces(self.backend, snapshots=snaps, mode=self.mode, epoch=epoch)  # type: ignore[arg-type]

    async def submit(self, epoch: int, request: str, steps: int) -> DurableSpaces:
        durable = self.adapter(epoch)
        reg = Registry().install(CodingTools).install(durable.extension)
        storage = SqliteStorage(str(self.log), synchronous="FULL")
        h = await Harness.open(
            storage, models={"s": ScriptedModel(SEED, steps)}, registry=reg, env=durable.env
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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("mode", "kind"), [("transactional", "reverted"), ("checkpoint", "restored")]
)
async def test_a_log_that_lost_its_tail_on_the_same_boot_is_caught_up_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, kind: str, backend: str
) -> None:
    if why := unavailable_reason(backend):
        pytest.skip(f"backend {backend} unavailable: {why}")
    boot = tmp_path / "boot_id"
    boot.write_text("boot-a\n")
    monkeypatch.setenv(BOOT_ENV, str(boot))  # never changes: the host did not reboot
    host = Host(tmp_path, mode, backend)
    try:
        await host.submit(1, "first", 3)
        kept = await _files(host.backend)
        shutil.copy(host.log, tmp_path / "log.kept")  # what the log's storage keeps
        await host.submit(2, "second", 6)  # three more calls change the Space
        ahead = await _files(host.backend)
        assert ahead != kept

        # The log's storage loses its tail; the Space and the host go on as they were.
        shutil.copy(tmp_path / "log.kept", host.log)
        resumed = await host.submit(3, "", 0)  # the next driver binds to the Space
        brought_back = await _files(host.backend)
        # The forgotten calls, asked for again, run once each: the same workspace as
        # before (else log.txt holds a bash call's line twice).
        again = await host.submit(4, "second", 6)
        assert await _files(host.backend) == ahead
        assert brought_back == kept, "the Space was still ahead of the log"
        assert [e.kind for e in resumed.events] == ["log_behind", kind]
        assert "log_behind" not in [e.kind for e in again.events]
    finally:
        await host.backend.close()


@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
async def test_a_log_that_lost_every_commit_starts_from_an_empty_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """SQLite ``NORMAL`` in WAL mode syncs the WAL only when it checkpoints it: a short
    conversation's storage that loses power loses every commit. The Space's ledger still
    knows the conversation's positions: the log is behind, not new."""
    boot = tmp_path / "boot_id"
    boot.write_text("boot-a\n")
    monkeypatch.setenv(BOOT_ENV, str(boot))
    host = Host(tmp_path, mode, "local")
    SqliteStorage(host.log).close()  # the log as created: its identity is in the file
    shutil.copy(host.log, tmp_path / "log.created")
    await host.submit(1, "first", 3)
    once = await _files(host.backend)
    for f in tmp_path.glob("log.sqlite*"):
        f.unlink()
    shutil.copy(tmp_path / "log.created", host.log)  # nothing of its commits reached disk
    again = await host.submit(2, "first", 3)
    assert await _files(host.backend) == once  # each call's line once in journal.txt
    assert [e.kind for e in again.events][:2] == ["log_behind", "reverted"]


async def test_a_log_that_kept_its_tail_is_not_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-a\n")
    monkeypatch.setenv(BOOT_ENV, str(boot))
    host = Host(tmp_path, "transactional", "local")
    await host.submit(1, "first", 3)
    durable = await host.submit(2, "", 0)
    assert durable.events == []
    await host.submit(3, "second", 6)
    assert "log_behind" not in [e.kind for e in (await host.submit(4, "", 0)).events]


def test_positions_read_back_are_validated() -> None:
    good = {"calls": {}, "calls_total": 1, "marks": 3}
    assert SpaceState.from_json(good).marks == 3
    for value in (-1, "3", 2.5, True, "3; rm -rf /"):
        with pytest.raises(PermanentFailure, match="damaged: position"):
            SpaceState.from_json({**good, "marks": value})
    rec = {"call_id": "c", "tool": "bash", "order": 1, "mark": "1"}
    with pytest.raises(PermanentFailure, match="call position"):
        SpaceState.from_json({**good, "calls": {"c": rec}})


async def test_a_restored_ledger_is_filled_up_to_the_log_so_one_probe_suffices(
    tmp_path: Path,
) -> None:
    """A whole machine restored from a checkpoint has its ledger as of the checkpoint
    (here: positions 1-2 of a log at 5). Filled up to the log, a later loss of the log's
    tail back to any of those positions is still seen by the one probe after it."""
    backend = open_backend("local", tmp_path / "spaces")
    try:
        space = await backend.create("s")
        await space.advance_epoch(1)
        for p in (1, 2):
            await log_witness.record(space, log_witness.position_key(f"{LOG}:c", p), 1)
        witness = LogWitness(LOG)
        assert await witness.behind("c", SpaceState(marks=3), space) is None  # 4 unknown
        await witness.fill("c", SpaceState(marks=5), space, 1, walk=log_witness.RESTORED_WALK)
        for lost_to in (0, 1, 2, 3, 4):
            assert await witness.behind("c", SpaceState(marks=lost_to), space) == 5
        assert await witness.behind("c", SpaceState(marks=5), space) is None
        assert (await space.exec_record(f"{LOG}:c#4")).state is ExecState.UNKNOWN  # a filler
    finally:
        await backend.close()


async def test_a_second_log_on_the_same_space_is_not_behind_the_first(tmp_path: Path) -> None:
    """Two logs whose conversations share an id take turns on one Space (the cluster's
    race: the second waits for the first's lease, then drives its own fresh log there).
    The ledger's positions are the first log's, not the second's: a witness keyed by the
    conversation (or the session's name) alone found the second's log "behind" and
    reverted the Space to its empty log, losing every effect of the first (lost_effect
    in the redrive race). Keys carry the log's identity: never shared."""
    backend = open_backend("local", tmp_path / "spaces")
    try:
        space = await backend.create("shared")
        await space.advance_epoch(1)
        first = LogWitness("a" * 32)
        for p in (1, 2, 3):
            await log_witness.record(space, first.owner("c1") + f"#{p}", 1)
        assert await first.behind("c1", SpaceState(marks=0), space) == 3  # a's own log lost
        second = LogWitness("b" * 32)
        assert await second.behind("c1", SpaceState(marks=0), space) is None
        key = second.next_position("c1", SpaceState(), CallRecord("x", "bash", 0))
        assert key == f"{'b' * 32}:c1#1"
    finally:
        await backend.close()
