"""No take-back deletes what nothing else holds (``adapter/quarantine.py``): before a
revert or a restore, what it would delete or replace that neither the log nor the target
checkpoint holds is kept in a quarantine checkpoint, named in the recovery event,
readable through the review API and kept by every prune for ``DS_QUARANTINE_DAYS``; a
take-back that deletes only what is held elsewhere keeps nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from durable_spaces.adapter import review
from durable_spaces.adapter.quarantine import DAY_S, Kept, at_risk, kept
from durable_spaces.adapter.space_state import DOC
from durable_spaces.errors import PermanentFailure, ReviewError
from durable_spaces.harness.log import SqliteStorage
from durable_spaces.harness.scheduler import Harness
from durable_spaces.harness.tools import Registry
from durable_spaces.space import PathEntry
from tests.adapter.drive import Attempt, drive, setup
from tests.adapter.test_nothing_lost import A_CALLS, THESIS, Host
from tests.needs import need


def test_what_is_at_risk() -> None:
    f = PathEntry("file", sha256="1" * 64)
    current = {
        "same": f,
        "other": PathEntry("file", sha256="2" * 64),
        "gone": f,
        "link": PathEntry("symlink", target="x"),
        "bad\\name": PathEntry("unsupported", target="a backslash"),
    }
    target = {"same": ("file", "1" * 64), "other": ("file", "3" * 64), "link": ("symlink", "x")}
    assert at_risk(current, target) == ["bad\\name", "gone", "other"]


def test_records_read_back_are_checked() -> None:
    good = {"checkpoint": "quarantine-m" + "a" * 64, "at": 1, "why": "reverted",
            "space": "s", "count": 1, "paths": ["a"]}  # fmt: skip
    assert Kept.from_json(good).paths == ("a",)
    for bad in (
        {"checkpoint": "../../x"},
        {"at": "1"},
        {"why": "rm"},
        {"paths": [1]},
        {"count": -1},
    ):
        with pytest.raises(PermanentFailure, match=r"damaged|malformed"):
            Kept.from_json({**good, **bad})


async def _open(host: Host, log: str) -> tuple[Harness, SqliteStorage]:
    storage = SqliteStorage(host.tmp / log)
    return await Harness.open(storage, models={}, registry=Registry()), storage


@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
async def test_a_log_behind_the_space_keeps_what_only_the_space_held(
    tmp_path: Path, mode: str
) -> None:
    """The log loses its tail; the Space holds the forgotten call's file and the user's
    thesis.txt. The witness takes the Space back to the log, keeping both first."""
    host = Host(tmp_path, "local", mode)
    try:
        await host.run("a.sqlite", A_CALLS)
        shutil.copy(tmp_path / "a.sqlite", tmp_path / "kept")
        await host.run("a.sqlite", [("write", {"path": "later.md", "content": "later\n"})])
        await host.add_by_hand("thesis.txt", THESIS)
        shutil.copy(tmp_path / "kept", tmp_path / "a.sqlite")  # the tail is lost
        durable, _ = await host.run("a.sqlite", [("bash", {"command": "true"})])
        kinds = [e.kind for e in durable.events]
        assert kinds[:2] == ["log_behind", "reverted" if mode == "transactional" else "restored"]
        named = durable.events[1].detail["quarantine"]
        (files,) = (await host.workspaces()).values()
        assert "thesis.txt" not in files and "later.md" not in files  # back to the log

        h, storage = await _open(host, "a.sqlite")
        try:
            (conv,) = [c.id for c in h.conversations()]
            (rec,) = review.quarantines(h, conv)
            assert rec.checkpoint == named and rec.why in ("reverted", "restored")
            assert set(rec.paths) == {"later.md", "thesis.txt"}
            reader = host.adapter()
            got = await review.quarantined(h, reader, conv, named)
            assert got["thesis.txt"] == THESIS and got["later.md"] == b"later\n"
            assert got["report.md"] == b"# Report\n"  # the whole workspace, as it was
            assert named in kept(h, days=30)
            assert named not in kept(h, days=1, now=rec.at + DAY_S + 1)  # past retention
            with pytest.raises(ReviewError, match="not a quarantine"):
                await review.quarantined(h, reader, conv, "x-m" + "0" * 64)
        finally:
            await h.close()
            storage.close()
    finally:
        await host.close()


async def test_a_take_back_of_what_the_log_holds_keeps_nothing(tmp_path: Path) -> None:
    host = Host(tmp_path, "local", "transactional")
    try:
        durable, _ = await host.run("a.sqlite", A_CALLS)
        (name,) = await host.backend.names()
        space = await host.backend.find(name)
        assert space is not None
        await space.remove("report.md", epoch=await space.current_epoch())  # by hand
        h, storage = await _open(host, "a.sqlite")
        try:
            (conv,) = [c.id for c in h.conversations()]
            durable = host.adapter(epoch=2)
            durable.bind_log(h.log_id)
            await durable.parts.spaces.raise_epoch_of(space, conv=conv)
            assert await durable.tx.revert(h, conv, space) is None  # a deletion: nothing lost
            assert await space.read_file("report.md") == b"# Report\n"
            await space.write_file("results.csv", b"edited by hand\n", epoch=2)
            cid = await durable.tx.revert(h, conv, space)
            assert cid is not None and await space.read_file("results.csv") == b"x,y\n1,2\n"
            assert (await review.quarantined(h, durable, conv, cid))["results.csv"] == (
                b"edited by hand\n"
            )
            assert h.conversation(conv).document(DOC) is not None
        finally:
            await h.close()
            storage.close()
    finally:
        await host.close()


@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
def test_an_interrupted_write_undone_is_kept_and_named_by_the_driver(
    tmp_path: Path, mode: str
) -> None:
    """A driver killed right after a write changed the Space (outcome unknown): the next
    one reverts or restores, the write's bytes kept first; the recovery line names the
    quarantine, and the session stays consistent."""
    setup(tmp_path, "local", mode, calls=4)
    o = drive(tmp_path, [Attempt("adapter.file_op:1"), Attempt()])
    assert o.codes[0] == -9 and o.codes[-1] == 0, o.stderr
    bad = {k: v for k, v in o.verdicts.items() if v.get("valid") is not True}
    assert not bad, bad
    undo = [e for e in o.events if e.get("kind") in ("reverted", "restored")]
    assert undo and all(e.get("quarantine") for e in undo), o.events
    log = json.dumps(o.events)
    assert "quarantine" in log


@pytest.mark.microvm
@pytest.mark.slow
def test_a_machine_restore_keeps_the_machine_first(tmp_path: Path) -> None:
    """A whole-machine checkpoint holds no workspace to compare with: before a machine
    restore (a driver killed after a write, checkpoint mode with machine checkpoints),
    the machine as it is becomes a quarantine checkpoint, and no prune removes it."""
    need("microvm")
    setup(tmp_path, "microvm", "checkpoint", calls=4, sleep=0.0, snapshots="sandbox")
    o = drive(tmp_path, [Attempt("adapter.file_op:1"), Attempt()], backend="microvm")
    assert o.codes[0] == -9 and o.codes[-1] == 0, o.stderr
    assert o.valid, o.verdicts
    (undo,) = [e for e in o.events if e.get("kind") == "restored"]
    kept = str(undo["quarantine"])
    assert (tmp_path / "spaces" / "checkpoints" / kept).is_dir()  # pruned calls since
