"""Sessions against a real PostgreSQL: epochs max(previous + 1, lease token) committed
before they are returned, coordinators' claims with SKIP LOCKED and expiry, takeover."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import pytest
from racing import race

from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import ClaimLostError, ConfigError, UnknownRecordError

OpenStore = Callable[..., ClusterStore]


def with_space(s: ClusterStore, *sessions: str) -> None:
    s.register_host("h1", "10.1.0.1:7000", "docker")
    s.create_space("sp")
    s.place_space("sp", 1, "h1", "10.1.0.1:7001", "tok-1")
    for name in sessions:
        s.create_session(name, "sp")


def test_epoch_is_max_of_previous_plus_one_and_the_lease_token(stores: OpenStore) -> None:
    s = stores()
    with_space(s, "a", "b")
    s.claim_session("c1", 60, "a")
    s.claim_session("c1", 60, "b")
    a = [s.begin_drive("a", "c1") for _ in range(3)]
    assert [(d.epoch, d.lease_token) for d in a] == [(1, 1), (2, 2), (3, 3)]
    s.finish_session("a", "c1", "done")
    # b has issued nothing yet (previous 0) but the Space's lease is at 4: epoch 4.
    b = s.begin_drive("b", "c1")
    assert (b.epoch, b.lease_token) == (4, 4)
    # A fenced driver saw the Space at epoch 10: previous + 1 = 11 beats the token 5.
    s.raise_epoch_floor("b", "c1", 10)
    b = s.begin_drive("b", "c1")
    assert (b.epoch, b.lease_token) == (11, 5)
    s.raise_epoch_floor("b", "c1", 3)  # a floor below never lowers it
    assert s.begin_drive("b", "c1").epoch == 12
    issued = s.events("epoch_issued", session="b")
    assert all(
        e.detail["epoch"] == max(e.detail["previous"] + 1, e.detail["lease_token"]) for e in issued
    )


def test_the_epoch_is_durable_when_begin_drive_returns(stores: OpenStore) -> None:
    s, observer = stores(), stores()
    s.create_session("solo")  # no Space: epochs are previous + 1
    s.claim_session("c1", 60, "solo")
    for want in (1, 2, 3):
        d = s.begin_drive("solo", "c1")
        assert (d.epoch, d.lease_token, d.attempt) == (want, None, want)
        # another connection already sees it committed
        assert observer.session("solo").epoch == want


def test_a_drive_waits_while_another_session_holds_the_space(stores: OpenStore) -> None:
    s = stores()
    with_space(s, "a", "b")
    s.claim_session("c1", 60, "a")
    s.claim_session("c2", 60, "b")
    first = s.begin_drive("a", "c1")
    waiting = s.begin_drive("b", "c2")
    assert waiting.pending and waiting.epoch is None
    assert waiting.reason == "held by session:a"
    assert s.session("b").epoch == 0  # no epoch burnt while pending
    s.finish_session("a", "c1", "done")  # releases the lease in the same transaction
    assert s.lease("sp").holder is None
    nxt = s.begin_drive("b", "c2")
    assert (nxt.pending, nxt.lease_token) == (False, first.lease_token + 1)  # type: ignore[operator]
    fin = s.events("session_finished", session="a")[0]
    assert fin.detail["released_token"] == 1


def test_racing_coordinators_exactly_one_claims_a_session(stores: OpenStore) -> None:
    s = stores()
    names = [f"s{i}" for i in range(8)]
    for n in names:
        s.create_session(n)
    coords = [stores() for _ in range(3)]
    for c in coords:
        c.sessions()  # connected before the race
    for n in names:
        got = race([partial(c.claim_session, f"coord{i}", 60, n) for i, c in enumerate(coords)])
        won = [g for g in got if g is not None]
        assert len(won) == 1, got
        assert s.session(n).claimed_by == won[0].claimed_by


def test_claim_next_passes_over_claimed_sessions(stores: OpenStore) -> None:
    s = stores()
    for n in ("x", "y"):
        s.create_session(n)
    first = s.claim_session("c1", 60)
    second = s.claim_session("c2", 60)
    assert first is not None and second is not None
    assert {first.name, second.name} == {"x", "y"}
    assert s.claim_session("c3", 60) is None
    assert s.claim_session("c1", 60) is None  # c1 holds x; claim-next finds nothing else


def test_a_lapsed_claim_is_taken_over_and_the_old_holder_is_refused(stores: OpenStore) -> None:
    s = stores()
    with_space(s, "a")
    assert s.claim_session("old", 0.3, "a") is not None
    d1 = s.begin_drive("a", "old")
    assert s.claim_session("new", 60, "a") is None  # not lapsed yet
    time.sleep(0.5)
    # Lapsed but not taken: still the old coordinator's.
    assert s.renew_session_claim("a", "old", 0.3).claimed_by == "old"
    time.sleep(0.5)
    took = s.claim_session("new", 60, "a")
    assert took is not None and took.claimed_by == "new"
    assert s.events("session_claimed", session="a")[-1].detail["previous"] == "old"
    for op in (
        lambda: s.renew_session_claim("a", "old", 60),
        lambda: s.begin_drive("a", "old"),
        lambda: s.finish_session("a", "old", "done"),
        lambda: s.raise_epoch_floor("a", "old", 99),
    ):
        with pytest.raises(ClaimLostError, match="claimed by coordinator new"):
            op()
    refused = s.events("claim_refused", session="a")
    assert [e.detail["op"] for e in refused] == [
        "renew",
        "begin_drive",
        "finish",
        "raise_epoch_floor",
    ]
    d2 = s.begin_drive("a", "new")
    assert d2.epoch == d1.epoch + 1  # type: ignore[operator]
    assert s.session("a").epoch == d2.epoch  # the refused floor changed nothing


def test_finish_is_stored_once_and_a_finished_session_cannot_be_claimed(
    stores: OpenStore,
) -> None:
    s = stores()
    s.create_session("a")
    s.claim_session("c1", 60, "a")
    s.begin_drive("a", "c1")
    done = s.finish_session("a", "c1", "done", "all steps applied")
    again = s.finish_session("a", "c1", "done", "all steps applied")  # a retry: no-op
    assert done == again
    assert len(s.events("session_finished")) == 1
    with pytest.raises(ClaimLostError, match="it is done"):
        s.finish_session("a", "c1", "failed")
    with pytest.raises(ClaimLostError, match="it is done"):
        s.begin_drive("a", "c1")
    assert s.claim_session("c2", 60, "a") is None
    with pytest.raises(ConfigError, match="done or failed"):
        s.finish_session("a", "c1", "running")


def test_a_session_on_an_unknown_space_and_bad_event_details_are_typed_errors(
    stores: OpenStore,
) -> None:
    s = stores()
    with pytest.raises(UnknownRecordError, match="create_space it first"):
        s.create_session("a", "nope")
    with pytest.raises(ConfigError, match="event detail is not JSON"):
        s.record_event("driver_exit", session="a", code=object())
    s.record_event("driver_exit", session="a", code=-9)
    assert s.events("driver_exit")[0].detail == {"code": -9}
