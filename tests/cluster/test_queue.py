"""The campaign run queue against a real PostgreSQL: SKIP LOCKED dequeue, a dead
worker's run given back when its claim lapses, a record stored once."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import psycopg
import pytest
from racing import race

from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import ClaimLostError, ClusterConflictError, ConfigError

OpenStore = Callable[..., ClusterStore]


def test_enqueue_is_idempotent_and_a_different_spec_conflicts(stores: OpenStore) -> None:
    s = stores()
    a = s.enqueue_run("r1", "crash", {"seed": 1, "kill": [1, 2]})
    b = s.enqueue_run("r1", "crash", {"seed": 1, "kill": (1, 2)})  # same JSON
    assert a == b and a.state == "queued"
    with pytest.raises(ClusterConflictError, match="another spec"):
        s.enqueue_run("r1", "crash", {"seed": 2})
    with pytest.raises(ConfigError, match="not JSON"):
        s.enqueue_run("r2", "crash", {"f": object()})
    assert len(s.events("run_queued")) == 1


def test_racing_workers_take_each_run_exactly_once(stores: OpenStore) -> None:
    s = stores()
    for i in range(24):
        s.enqueue_run(f"r{i:02d}", "crash", {"seed": i})
    workers = [stores() for _ in range(3)]
    for w in workers:
        w.runs()

    def drain(w: ClusterStore, name: str) -> list[str]:
        took = []
        while (run := w.dequeue_run(name, 60)) is not None:
            took.append(run.id)
            w.finish_run(run.id, name, {"ok": True, "by": name})
        return took

    got = race([partial(drain, w, f"w{i}") for i, w in enumerate(workers)])
    every = [r for took in got for r in took]
    assert sorted(every) == [f"r{i:02d}" for i in range(24)]  # all, none twice
    assert all(r.state == "done" and r.attempts == 1 for r in s.runs("crash"))
    assert len(s.events("run_finished")) == 24


def test_a_dead_workers_run_comes_back_when_its_claim_lapses(stores: OpenStore) -> None:
    s = stores()
    s.enqueue_run("r1", "crash", {"seed": 1})
    s.enqueue_run("r2", "crash", {"seed": 2})
    dead = s.dequeue_run("dead", 0.3)
    assert dead is not None and dead.id == "r1"
    assert s.dequeue_run("live", 60).id == "r2"  # type: ignore[union-attr]
    assert s.dequeue_run("live", 60) is None  # r1 is still claimed
    time.sleep(0.5)
    back = s.dequeue_run("live", 60)
    assert back is not None and (back.id, back.worker, back.attempts) == ("r1", "live", 2)
    assert s.events("run_claimed")[-1].detail["previous"] == "dead"
    # The dead worker wakes up: its renew and its record are refused and counted.
    with pytest.raises(ClaimLostError, match="its worker is live"):
        s.renew_run("r1", "dead", 60)
    with pytest.raises(ClaimLostError, match="its worker is live"):
        s.finish_run("r1", "dead", {"from": "dead"})
    assert [e.detail["op"] for e in s.events("run_claim_refused")] == ["renew", "finish"]
    assert s.finish_run("r1", "live", {"from": "live"}).record == {"from": "live"}


def test_a_finished_run_stores_its_record_once(stores: OpenStore) -> None:
    s = stores()
    s.enqueue_run("r1", "crash", {"seed": 1})
    s.dequeue_run("w", 60)
    first = s.finish_run("r1", "w", {"ok": True, "kills": 3})
    assert s.finish_run("r1", "w", {"ok": True, "kills": 3}) == first  # a retry: no-op
    with pytest.raises(ClaimLostError, match="it is done"):
        s.finish_run("r1", "w", {"ok": False})
    with pytest.raises(ClaimLostError, match="it is done"):
        s.finish_run("r1", "other", {"ok": True, "kills": 3})
    assert s.run("r1").record == {"ok": True, "kills": 3}
    assert len(s.events("run_finished")) == 1
    assert s.dequeue_run("w2", 60) is None  # a done run is never handed out again


def test_the_database_itself_refuses_to_rewrite_history(stores: OpenStore) -> None:
    s = stores()
    s.enqueue_run("r1", "crash", {"seed": 1})
    s.dequeue_run("w", 60)
    s.finish_run("r1", "w", {"ok": True})
    s.create_space("sp")
    s.acquire_lease("sp", "a")
    for statement in (
        "UPDATE ds.runs SET record = '{\"ok\": false}' WHERE id = 'r1'",
        "UPDATE ds.events SET kind = 'x'",
        "DELETE FROM ds.events",
        "TRUNCATE ds.events",
        "UPDATE ds.leases SET token = 0",
    ):
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation, match="ds: "):
            s.db.run(lambda c, q=statement: c.execute(q))
