"""LogState: what committed ops imply, read without a harness or an event loop."""

from __future__ import annotations

import pytest

from durable_spaces.harness.state import AgentConfig, LogState, Tx

AGENT = AgentConfig(model="m")


def _commit(state: LogState, build) -> object:  # type: ignore[no-untyped-def]
    """What the harness does: build against the state, then apply the ops as seq n+1."""
    tx = Tx(state)
    out = build(tx)
    state.apply(state.last_seq + 1, tx.ops)
    return out


def test_a_fork_sees_the_parent_up_to_its_entry_and_documents_as_of_it() -> None:
    s = LogState()
    root = _commit(s, lambda tx: tx._conversation(AGENT))
    e1 = _commit(s, lambda tx: tx.entry(root, "user", {"n": 1}))
    _commit(s, lambda tx: tx.put_document(root, "d", {"v": 1}, rewindable=True))
    e2 = _commit(s, lambda tx: tx.entry(root, "user", {"n": 2}))
    _commit(s, lambda tx: tx.put_document(root, "d", {"v": 2}, rewindable=True))
    _commit(s, lambda tx: tx.put_document(root, "latest", 2))
    fork = _commit(s, lambda tx: tx._conversation(AGENT, root, e1))
    e3 = _commit(s, lambda tx: tx.entry(fork, "user", {"n": 3}))

    assert [e.id for e in s.visible(fork)] == [e1, e3]
    assert [e.id for e in s.visible(root)] == [e1, e2]
    assert s.document(root, "d", None, None) == {"v": 2}
    assert s.document(root, "d", e1, None) is None  # written after e1's commit
    assert s.document(root, "d", e2, None) == {"v": 1}
    assert s.document(root, "latest", e1, None) == 2  # not rewindable: always the latest
    # An inherited entry is read in the parent: nothing was written as of e1 there.
    assert s.document(fork, "d", e1, "absent") == "absent"
    assert s.rewindable_at(root, s.entries[e2]) == ["d"]
    with pytest.raises(KeyError):
        s.document(fork, "d", e2, None)  # e2 is after the fork entry: not visible


def test_ids_continue_from_what_was_committed_and_unknown_input_is_refused() -> None:
    s = LogState()
    root = _commit(s, lambda tx: tx._conversation(AGENT))
    ids = [_commit(s, lambda tx: tx.entry(root, "user", {})) for _ in range(3)]
    assert ids == ["e1", "e2", "e3"]
    replayed = LogState()  # a new process replaying the same log allocates e4 next
    conv = {"op": "conversation", "id": "c1", "agent": AGENT.to_json()}
    entry = {"op": "entry", "id": "e3", "conversation_id": "c1", "kind": "u", "data": {}}
    replayed.apply(1, [conv])
    replayed.apply(2, [entry])
    assert _commit(replayed, lambda tx: tx.entry("c1", "user", {})) == "e4"
    with pytest.raises(KeyError, match="no conversation"):
        Tx(s).entry("c9", "user", {})
    with pytest.raises(ValueError, match="unknown op"):
        s.apply(99, [{"op": "bogus"}])
