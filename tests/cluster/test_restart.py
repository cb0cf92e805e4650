"""The database restarts (pg_ctl stop/start, and a crash) in the middle of a sequence:
clients reconnect by themselves and nothing is lost or duplicated."""

from __future__ import annotations

import threading
import time

import pytest

from durable_spaces.cluster.pgserver import PgServer
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import ClusterUnavailableError, LeaseLostError


def test_drives_go_on_across_a_restart_and_a_crash_with_nothing_lost_or_repeated(
    private_pg: PgServer,
) -> None:
    s = ClusterStore(private_pg.url())
    s.register_host("h1", "10.1.0.1:7000", "docker")
    s.create_space("sp")
    s.place_space("sp", 1, "h1", "10.1.0.1:7001", "tok")
    s.create_session("a", "sp")
    s.claim_session("c1", 600, "a")
    drives = [s.begin_drive("a", "c1") for _ in range(3)]
    private_pg.stop("fast")
    private_pg.start()
    drives += [s.begin_drive("a", "c1") for _ in range(2)]  # the same store reconnects
    private_pg.crash()  # pg_ctl stop -m immediate: recovery replays the WAL
    private_pg.start()
    drives += [s.begin_drive("a", "c1") for _ in range(2)]
    epochs = [d.epoch for d in drives]
    assert epochs == [1, 2, 3, 4, 5, 6, 7]
    assert [d.lease_token for d in drives] == epochs
    fresh = ClusterStore(private_pg.url())
    issued = [e.detail["epoch"] for e in fresh.events("epoch_issued")]
    assert issued == epochs  # every one durable, none twice
    assert fresh.session("a").attempts == 7
    with pytest.raises(LeaseLostError, match="superseded by token 7"):
        fresh.connect("sp", "a", 6)
    fresh.set_space_token("sp", 1, "h1", 7, "tok-7")  # its host's rotation for lease 7
    assert fresh.connect("sp", "a", 7).token.reveal() == "tok-7"
    s.close()
    fresh.close()


def test_a_call_made_while_the_database_is_down_completes_when_it_is_back(
    private_pg: PgServer,
) -> None:
    s = ClusterStore(private_pg.url(), reconnect_secs=30)
    s.create_session("a")
    s.claim_session("c1", 600, "a")
    private_pg.stop("fast")
    later = threading.Timer(1.0, private_pg.start)
    later.start()
    t0 = time.monotonic()
    d = s.begin_drive("a", "c1")  # blocks, reconnecting, until the server is back
    assert time.monotonic() - t0 >= 0.9
    assert d.epoch == 1
    later.join(60)  # pg_ctl start -w may still be waiting when the server already answers
    s.close()


def test_a_database_that_stays_down_is_a_typed_error_naming_it_without_a_password() -> None:
    with PgServer(tcp=True) as pg:
        url = pg.url(tcp=True)
        password = url.split(":")[2].split("@")[0]
        s = ClusterStore(url, reconnect_secs=1.0)
        s.create_session("a")
        pg.stop("fast")
        with pytest.raises(ClusterUnavailableError, match="unreachable for 1s") as info:
            s.session("a")
        assert f"127.0.0.1:{pg.port}/postgres" in str(info.value)
        assert password not in str(info.value) and password not in repr(s)
        s.close()


def test_workers_drain_the_queue_across_a_crash_each_record_stored_once(
    private_pg: PgServer,
) -> None:
    url = private_pg.url()
    ClusterStore(url).close()
    n = 40
    with ClusterStore(url) as s:
        for i in range(n):
            s.enqueue_run(f"r{i:02d}", "crash", {"seed": i})
    failures: list[BaseException] = []

    def work(name: str) -> None:
        with ClusterStore(url, reconnect_secs=30) as w:
            try:
                while True:
                    run = w.dequeue_run(name, 2.0)
                    if run is None:
                        if all(r.state == "done" for r in w.runs()):
                            return
                        time.sleep(0.2)  # a run claimed by a lost dequeue: wait its lapse
                        continue
                    time.sleep(0.03)  # the run's work
                    w.finish_run(run.id, name, {"seed": run.spec["seed"]})
            except BaseException as e:
                failures.append(e)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    with ClusterStore(url) as s:
        done_before = sum(r.state == "done" for r in s.runs())
    private_pg.crash()
    time.sleep(0.5)
    private_pg.start()
    for t in threads:
        t.join(120)
    assert failures == []
    assert 0 < done_before < n  # the crash came in the middle of the drain
    with ClusterStore(url) as s:
        runs = s.runs("crash")
        assert [r.id for r in runs] == [f"r{i:02d}" for i in range(n)]
        assert all(r.state == "done" and r.record == r.spec for r in runs)
        finished = [e.detail["run"] for e in s.events("run_finished")]
        assert sorted(finished) == [r.id for r in runs]  # each stored exactly once


def test_a_database_restart_does_not_make_every_host_look_lost(private_pg: PgServer) -> None:
    s = ClusterStore(private_pg.url())
    s.register_host("h1", "10.1.0.1:7000", "spacesd")
    time.sleep(2.2)  # h1 silent for longer than the bound (its agent could not reach us)
    private_pg.restart()
    assert s.mark_lost_hosts(2.0) == []  # the server only just started: nobody could beat
    time.sleep(2.2)
    assert s.mark_lost_hosts(2.0) == ["h1"]  # silent for the bound since the start
    s.close()
