"""Leases on durable Spaces against a real PostgreSQL: one holder, monotonic durable
tokens, superseded tokens refused and counted, the Space token kept secret."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import pytest
from racing import race

from durable_spaces.cluster.pgserver import PgServer
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import (
    ClusterConflictError,
    ConfigError,
    LeaseLostError,
    SpaceUnavailableError,
    UnknownRecordError,
)

OpenStore = Callable[..., ClusterStore]
TOKEN = "tok-SECRET-7f3a9c"


def placed(s: ClusterStore, name: str = "sp") -> None:
    s.register_host("h1", "10.1.0.1:7000", "docker")
    s.create_space(name)
    s.place_space(name, 1, "h1", "10.1.0.1:7001", TOKEN)


def test_second_session_is_pending_held_by_the_first_and_it_is_recorded(
    stores: OpenStore,
) -> None:
    s = stores()
    placed(s)
    s.create_session("b", "sp")
    a = s.acquire_lease("sp", "a")
    assert (a.granted, a.token, a.holder) == (True, 1, "a")
    b = s.acquire_lease("sp", "b")
    assert not b.granted
    assert b.reason == "held by session:a"
    assert b.holder == "a" and b.token == 1
    assert s.session("b").reason == "held by session:a"
    assert s.session("b").state == "pending"
    ev = s.events("lease_pending")
    assert [(e.session, e.detail["holder"]) for e in ev] == [("b", "a")]
    assert s.lease("sp").holder == "a"  # the pending acquisition changed nothing


def test_every_acquisition_gets_previous_plus_one_and_tokens_are_durable(
    stores: OpenStore,
) -> None:
    s = stores()
    placed(s)
    got = [s.acquire_lease("sp", "a").token for _ in range(3)]  # each drive acquires
    assert got == [1, 2, 3]
    s.release_lease("sp", "a", 3)
    assert s.lease("sp").holder is None
    assert s.acquire_lease("sp", "b").token == 4  # a release does not reset the counter
    # A new store (a new process, say) reads the same counter and goes on from it.
    other = stores()
    assert other.lease("sp").token == 4
    assert other.acquire_lease("sp", "b").token == 5
    tokens = [e.detail["token"] for e in s.events("lease_acquired")]
    assert tokens == [1, 2, 3, 4, 5]


def test_superseded_token_refused_on_renew_connect_release_and_counted(
    stores: OpenStore,
) -> None:
    s = stores()
    placed(s)
    s.acquire_lease("sp", "a")  # token 1
    s.acquire_lease("sp", "a")  # token 2 supersedes it
    for op in (
        lambda: s.renew_lease("sp", "a", 1),
        lambda: s.connect("sp", "a", 1),
        lambda: s.release_lease("sp", "a", 1),
    ):
        with pytest.raises(LeaseLostError, match="superseded by token 2") as info:
            op()
        assert (info.value.token, info.value.current) == (1, 2)
    refused = s.events("lease_refused")
    assert [(e.detail["op"], e.detail["token"], e.detail["current"]) for e in refused] == [
        ("renew", 1, 2),
        ("connect", 1, 2),
        ("release", 1, 2),
    ]
    # ... and the current one is accepted by all three (connect once its host rotated
    # the Space's token for it).
    assert s.renew_lease("sp", "a", 2).token == 2
    s.set_space_token("sp", 1, "h1", 2, TOKEN)
    conn = s.connect("sp", "a", 2)
    assert (conn.address, conn.token.reveal(), conn.generation) == ("10.1.0.1:7001", TOKEN, 1)
    assert s.release_lease("sp", "a", 2).holder is None
    assert len(s.events("lease_refused")) == 3


def test_other_sessions_token_a_released_one_and_an_unissued_one_are_refused(
    stores: OpenStore,
) -> None:
    s = stores()
    placed(s)
    s.acquire_lease("sp", "a")
    with pytest.raises(LeaseLostError, match="held by session:a"):
        s.connect("sp", "b", 1)  # b presents a's token
    with pytest.raises(LeaseLostError, match="never issued"):
        s.renew_lease("sp", "a", 7)
    s.release_lease("sp", "a", 1)
    with pytest.raises(LeaseLostError, match="released"):
        s.connect("sp", "a", 1)
    assert len(s.events("lease_refused")) == 3


def test_an_expired_lease_goes_to_another_session_and_the_old_token_is_then_refused(
    stores: OpenStore,
) -> None:
    s = stores()
    placed(s)
    assert s.acquire_lease("sp", "a", ttl=0.3).token == 1
    assert not s.acquire_lease("sp", "b").granted
    # Expired but not superseded: still a's (expiry only lets others in).
    time.sleep(0.5)
    assert s.renew_lease("sp", "a", 1, ttl=0.3).token == 1
    time.sleep(0.5)
    b = s.acquire_lease("sp", "b")
    assert (b.granted, b.token) == (True, 2)
    with pytest.raises(LeaseLostError, match="superseded by token 2"):
        s.renew_lease("sp", "a", 1)
    assert s.events("lease_acquired")[-1].detail["previous_holder"] == "a"


def test_racing_sessions_exactly_one_gets_the_lease(stores: OpenStore) -> None:
    placed(stores())
    for rnd in range(5):
        racers = [stores() for _ in range(4)]
        for st in racers:
            st.lease("sp")  # connected before the race starts
        got = race([partial(st.acquire_lease, "sp", f"r{rnd}-{i}") for i, st in enumerate(racers)])
        winners = [g for g in got if g.granted]
        assert len(winners) == 1, got
        w = winners[0]
        assert all(g.reason == f"held by session:{w.session}" for g in got if not g.granted)
        assert w.token == rnd + 1
        racers[0].release_lease("sp", w.session, w.token)


def test_the_space_token_is_never_in_reprs_events_or_the_server_log(
    stores: OpenStore, pg_server: PgServer
) -> None:
    s = stores()
    placed(s)
    a = s.acquire_lease("sp", "a")
    s.set_space_token("sp", 1, "h1", a.token, TOKEN)
    conn = s.connect("sp", "a", a.token)
    shown = [repr(conn), str(conn), repr(conn.token), str(conn.token), repr(s.space("sp"))]
    shown += [repr(s), repr(s.db), repr(s.spaces())]
    assert all(TOKEN not in x for x in shown), shown
    assert conn.token.reveal() == TOKEN
    assert all(TOKEN not in repr(e) for e in s.events())
    # A failing statement that carries the token as a bind parameter: only the statement
    # text reaches the server log, never the parameter.
    with pytest.raises(Exception, match="division by zero"):
        s.db.run(lambda c: c.execute("SELECT 1 / 0 WHERE %s::text IS NOT NULL", (TOKEN,)))
    assert "division by zero" in pg_server.log_path.read_text()
    assert TOKEN not in pg_server.log_path.read_text()


def test_bad_input_is_a_typed_error_before_any_sql(stores: OpenStore) -> None:
    s = stores()
    with pytest.raises(ConfigError, match="space"):
        s.acquire_lease("sp; rm -rf /", "a")
    with pytest.raises(ConfigError, match="token"):
        s.connect("sp", "a", "1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ttl"):
        s.acquire_lease("sp", "a", ttl=0)
    with pytest.raises(UnknownRecordError, match="no durable space 'nope'"):
        s.acquire_lease("nope", "a")


def test_a_space_token_is_handed_only_to_the_lease_it_was_minted_for(stores: OpenStore) -> None:
    s = stores()
    s.register_host("h1", "10.1.0.1:7000", "docker")
    s.create_space("sp")
    a = s.acquire_lease("sp", "a")
    s.place_space("sp", 1, "h1", "10.1.0.1:7001", TOKEN)  # minted during lease 1: its own
    assert s.connect("sp", "a", a.token).token.reveal() == TOKEN
    assert s.grant("sp", a.token).token_minted
    b = s.acquire_lease("sp", "a")  # the next drive: the token it knew must not carry over
    with pytest.raises(SpaceUnavailableError, match="minted for lease 1, not 2"):
        s.connect("sp", "a", b.token)
    with pytest.raises(ClusterConflictError, match="lease 1 is not the current one"):
        s.set_space_token("sp", 1, "h1", a.token, "tok-stale")
    with pytest.raises(ClusterConflictError, match="not ready on host h2"):
        s.set_space_token("sp", 1, "h2", b.token, "tok-b")
    s.set_space_token("sp", 1, "h1", b.token, "tok-b")
    assert s.connect("sp", "a", b.token).token.reveal() == "tok-b"
    assert "tok-b" not in repr(s.events("space_token_rotated"))
