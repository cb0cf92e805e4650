"""A Space knows its own log (``adapter/space_owner.py``): its owner record, read before
the epoch is raised, refuses another log's Space, changing nothing; and what tries to
break it: a hostile or damaged record planted through the Space, a fork, a Space placed
again, a log copied to another path."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from durable_spaces.adapter import space_owner
from durable_spaces.adapter.review import fork_at
from durable_spaces.adapter.space_owner import Claims, Owner
from durable_spaces.errors import SpaceOwnedError
from durable_spaces.harness.log import SqliteStorage
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.settings import Settings
from durable_spaces.space import Space
from durable_spaces.testing import CallListModel
from tests.adapter.test_nothing_lost import A_CALLS, THESIS, Host

A = "a" * 32
B = "b" * 32


def test_the_judge() -> None:
    me = Owner(A, "c1")
    none = Claims(None, 1)
    assert space_owner.judge(none, me, "refuse", "s", any_conversation=False) == "unclaimed"
    mine = Claims(Owner(A, "c1"), 2)
    assert space_owner.judge(mine, me, "refuse", "s", any_conversation=False) == "mine"
    sibling = Claims(Owner(A, "c2"), 2)
    assert space_owner.judge(sibling, me, "refuse", "s", any_conversation=True) == "mine"
    with pytest.raises(SpaceOwnedError, match="another conversation of this log"):
        space_owner.judge(sibling, me, "refuse", "s", any_conversation=False)
    other = Claims(Owner(B, "c1"), 2)
    with pytest.raises(SpaceOwnedError, match=r"another log .*Nothing was changed"):
        space_owner.judge(other, me, "refuse", "s", any_conversation=True)
    for adopt in ("as-is", "log"):
        assert space_owner.judge(other, me, adopt, "s", any_conversation=False) == "take"
    bad = Claims(None, 3, "claim #2 is not a record of ours")
    with pytest.raises(SpaceOwnedError, match="cannot be trusted: claim #2"):
        space_owner.judge(bad, me, "refuse", "s", any_conversation=False)


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"garbage",
        b'{"log": "' + b"A" * 32 + b'", "conversation": "c1"}',
        b'{"log": "' + b"a" * 32 + b'", "conversation": "c1; rm -rf /"}',
        b'{"log": "' + b"a" * 32 + b'", "conversation": "c1", "x": 1}',
        b"\xff\xfe",
    ],
)
def test_a_record_that_is_not_ours_parses_to_nothing(text: bytes) -> None:
    assert Owner.parse(text) is None


async def _only_space(host: Host) -> Space:
    (name,) = await host.backend.names()
    space = await host.backend.find(name)
    assert space is not None
    return space


async def _plant(space: Space, n: int, argv: list[str]) -> None:
    """What a command in the Space (or a client with the daemon's token) can do: run
    something under the next claim's key."""
    run = await space.spawn(argv, key=f"ds-owner#{n}", epoch=await space.current_epoch())
    await run.wait()


@pytest.mark.parametrize(
    ("planted", "why"),
    [
        (["printf", "%s", "not ours"], "cannot be trusted"),
        (["sh", "-c", f'printf \'%s\' \'{{"log": "{B}", "conversation": "c1"}}\''], "another log"),
        (["sh", "-c", "head -c 70000 /dev/zero | tr '\\0' x"], "cannot be trusted"),
        (
            ["sh", "-c", f'printf \'%s\' \'{{"log": "{B}", "conversation": "c1"}}\'; exit 3'],
            "cannot be trusted",
        ),
    ],
    ids=["garbage", "another-log", "huge", "failed"],
)
async def test_a_planted_owner_record_refuses_and_changes_nothing(
    tmp_path: Path, planted: list[str], why: str
) -> None:
    """A record planted after the log's own claim: the next driver of the log refuses
    the Space (nothing deleted on a claim's word), and takes it back only when told."""
    host = Host(tmp_path, "local", "transactional")
    try:
        await host.run("a.sqlite", A_CALLS, namespace="s")
        space = await _only_space(host)
        await _plant(space, 2, planted)
        await host.add_by_hand("thesis.txt", THESIS)
        seen = await host.workspaces()
        with pytest.raises(SpaceOwnedError, match=why):
            await host.run(
                "a.sqlite", [("bash", {"command": "echo more >> results.csv"})], namespace="s"
            )
        assert await host.workspaces() == seen
        host.settings = Settings(space_adopt="as-is")
        durable, _ = await host.run(
            "a.sqlite", [("bash", {"command": "echo more >> results.csv"})], namespace="s"
        )
        kinds = [e.kind for e in durable.events]
        assert kinds[0] == "claimed" and "reverted" not in kinds, kinds
        was = durable.events[0].detail["was"]  # whose it was: the planted claim's
        assert (B[:12] in was) if why == "another log" else was == "unknown", was
        (files,) = (await host.workspaces()).values()
        assert files["thesis.txt"] == THESIS and files["results.csv"].endswith(b"more\n")
        assert (await space_owner.read(space)).owner == Owner(
            durable.parts.spaces.log_id or "", "c1"
        )
    finally:
        await host.close()


async def test_a_fork_gets_a_space_of_its_own_and_the_parent_keeps_its_own(
    tmp_path: Path,
) -> None:
    host = Host(tmp_path, "local", "transactional")
    try:
        durable = host.adapter()
        calls: list[tuple[str, Any]] = [*A_CALLS, ("bash", {"command": "echo later > later.txt"})]
        reg = Registry().install(CodingTools).install(durable.extension)
        storage = SqliteStorage(tmp_path / "a.sqlite")
        h = await Harness.open(
            storage, models={"m": CallListModel(calls)}, registry=reg, env=durable.env
        )
        try:
            root = await h.root(AgentConfig(model="m"))
            assert (await (await root.submit("go", request_id="go")).wait()).status == "done"
            second = [e for e in root.entries() if e.kind == "tool_result"][1]
            fork = await fork_at(h, durable, root.id, second.id)
            spaces = await host.workspaces()
            assert len(spaces) == 2
            parent, child = durable.name_for(root.id), durable.name_for(fork.id)
            assert "later.txt" in spaces[parent] and "later.txt" not in spaces[child]
            for name, conv in ((parent, root.id), (child, fork.id)):
                sp = await host.backend.find(name)
                assert sp is not None
                assert (await space_owner.read(sp)).owner == Owner(h.log_id, conv)
        finally:
            await h.close()
            await durable.close()
            storage.close()
        # the parent goes on in its own Space, not refused
        await host.run("a.sqlite", [("bash", {"command": "echo on >> later.txt"})])
    finally:
        await host.close()


async def test_a_space_placed_again_is_claimed_anew(tmp_path: Path) -> None:
    host = Host(tmp_path, "local", "transactional")
    try:
        await host.run("a.sqlite", A_CALLS)
        space = await _only_space(host)
        await host.backend.delete(space.name)  # lost: placed again from scratch
        durable, _ = await host.run("a.sqlite", [("bash", {"command": "cat report.md"})])
        assert "reimaged" in [e.kind for e in durable.events]
        space = await _only_space(host)
        assert (await space_owner.read(space)) == Claims(
            Owner(durable.parts.spaces.log_id or "", "c1"), 2
        )
    finally:
        await host.close()


async def test_a_log_copied_to_another_path_is_the_same_log(tmp_path: Path) -> None:
    """A copy has the log's identity: it drives the log's Space. An older copy is the log
    that lost its tail: the witness brings the Space back to it, and what the copy does
    not hold is in a quarantine."""
    host = Host(tmp_path, "local", "transactional")
    try:
        await host.run("a.sqlite", A_CALLS)
        shutil.copy(tmp_path / "a.sqlite", tmp_path / "copy.sqlite")
        await host.run("a.sqlite", [("write", {"path": "b.txt", "content": "later\n"})])
        durable, _ = await host.run(
            "copy.sqlite", [("write", {"path": "c.txt", "content": "copy\n"})]
        )
        kinds = [e.kind for e in durable.events]
        assert kinds[:2] == ["log_behind", "reverted"], kinds
        assert durable.events[1].detail.get("quarantine")
        (files,) = (await host.workspaces()).values()
        assert "b.txt" not in files and files["c.txt"] == b"copy\n"
    finally:
        await host.close()
