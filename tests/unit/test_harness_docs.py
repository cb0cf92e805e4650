"""Documents (latest / rewindable), reading as of an entry, forks, custom entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_spaces.harness.log import MemoryStorage
from durable_spaces.harness.scheduler import AgentConfig, Conversation, Harness, Tx
from durable_spaces.harness.tools import Registry
from durable_spaces.testing import ScriptedModel


async def _root(st: MemoryStorage) -> tuple[Harness, Conversation]:
    h = await Harness.open(st, models={"m": ScriptedModel(0, 0)}, registry=Registry())
    return h, await h.root(AgentConfig("m"))


async def _note(conv: Conversation, text: str, **docs: int) -> str:
    """A custom entry and rewindable doc writes, in one commit; returns the entry id."""

    def build(tx: Tx) -> str:
        for name, value in docs.items():
            tx.put_document(conv.id, name, {"v": value}, rewindable=True)
        return tx.entry(conv.id, "note", {"text": text})

    return str(await conv.commit(build))


async def test_latest_and_rewindable_documents(tmp_path: Path) -> None:
    st = MemoryStorage()
    _, root = await _root(st)
    e1 = await _note(root, "one", state=1)
    e2 = await _note(root, "two")
    e3 = await _note(root, "three", state=3)
    await root.commit(lambda tx: tx.put_document(root.id, "plain", 1))
    await root.commit(lambda tx: tx.put_document(root.id, "plain", 2))
    assert root.document("state") == {"v": 3}
    assert root.document("state", as_of=e1) == {"v": 1}
    assert root.document("state", as_of=e2) == {"v": 1}
    assert root.document("state", as_of=e3) == {"v": 3}
    assert root.document("plain") == 2
    assert root.document("missing", default="x") == "x"
    # Values are copies: mutating one does not change the log's state.
    root.document("state")["v"] = 99
    assert root.document("state") == {"v": 3}
    assert [e.kind for e in root.entries()] == ["note", "note", "note"]
    assert root.entries()[0].data == {"text": "one"}


async def test_fork_sees_entries_and_documents_as_of_the_entry() -> None:
    st = MemoryStorage()
    _, root = await _root(st)
    e1 = await _note(root, "one", state=1)
    e2 = await _note(root, "two", state=2)
    await _note(root, "three", state=3)
    fork = await root.fork(e2)
    assert (fork.parent_id, fork.fork_entry_id) == (root.id, e2)
    assert [e.id for e in fork.entries()] == [e1, e2]
    assert fork.document("state") == {"v": 2}
    assert fork.document("state", as_of=e1) == {"v": 1}
    f1 = await _note(fork, "fork-one", state=20)
    assert fork.document("state") == {"v": 20}
    assert fork.document("state", as_of=f1) == {"v": 20}
    assert fork.document("state", as_of=e2) == {"v": 2}
    assert root.document("state") == {"v": 3}  # the parent is untouched
    assert [e.data["text"] for e in root.entries()] == ["one", "two", "three"]
    # A fork of a fork, at an entry inherited from the grandparent.
    grand = await fork.fork(e1)
    assert [e.id for e in grand.entries()] == [e1]
    assert grand.document("state") == {"v": 1}
    assert grand.agent == root.agent
    other = await root.fork(e1, agent=AgentConfig("m", system="forked"))
    assert other.agent.system == "forked" and root.agent.system is None
    with pytest.raises(KeyError):
        fork.document("state", as_of=root.entries()[2].id)  # not visible in the fork
    # Everything survives a reopen.
    h2 = await Harness.open(st, models={}, registry=Registry())
    fork2 = h2.conversation(fork.id)
    assert fork2.entries() == fork.entries()
    assert fork2.document("state", as_of=e2) == {"v": 2}
    assert {c.id for c in h2.conversations()} == {root.id, fork.id, grand.id, other.id}


async def test_a_commit_is_all_or_nothing() -> None:
    st = MemoryStorage()
    _, root = await _root(st)

    def bad(tx: Tx) -> None:
        tx.entry(root.id, "note", {"text": "half"})
        tx.entry("no-such-conversation", "note", {})

    with pytest.raises(KeyError):
        await root.commit(bad)
    assert root.entries() == []
    assert len(st.load()) == 1  # only the root's creation


async def test_a_read_document_is_a_copy_at_every_depth() -> None:
    """What a reader changes in a document it read never reaches the committed state
    (documents are copied by ``json_copy``, not ``copy.deepcopy``: nested dicts and
    lists, inside tuples too, must still be new objects)."""
    st = MemoryStorage()
    _, root = await _root(st)
    value = {"a": {"b": [1, {"c": 2}]}, "t": ({"d": [3]},)}
    await root.commit(lambda tx: tx.put_document(root.id, "deep", value))
    got = root.document("deep")
    got["a"]["b"][1]["c"] = 99
    got["a"]["b"].append(4)
    got["t"][0]["d"].append(5)
    again = root.document("deep")
    assert again["a"] == {"b": [1, {"c": 2}]}
    assert again["t"][0] == {"d": [3]}
