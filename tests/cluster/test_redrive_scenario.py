"""The ``redrive`` campaign scenario: a tiny campaign through real clusters (PostgreSQL,
hosts in network namespaces, coordinators), its SUMMARY fields, and the cluster checks
(``campaigns/checks/leases.py``) shown to fail on a store whose fence was broken."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from durable_spaces.campaigns.checks.leases import tally
from durable_spaces.campaigns.runner import run_campaign
from durable_spaces.campaigns.scenarios.redrive import SUMMARY_FIELDS, kind_of
from durable_spaces.campaigns.spec import CampaignSpec
from durable_spaces.campaigns.summary import Summary
from durable_spaces.cluster.store import ClusterStore

OpenStore = Callable[..., ClusterStore]


def test_a_tiny_redrive_campaign_is_consistent_and_its_summary_counts_the_cluster(
    netns_lab: object, tmp_path: Path
) -> None:
    # netns_lab: skips naming what is missing (root, ip, PostgreSQL, cua-spacesd); each
    # run makes a lab of its own
    seed_base = "rt17"  # a database restart, a driver kill, a race
    assert [kind_of(f"{seed_base}-{i}") for i in range(3)] == ["db_restart", "driver_kill", "race"]
    spec = CampaignSpec(scenario="redrive", backend="local", runs=3, seed_base=seed_base)
    out = io.StringIO()
    result = run_campaign(
        spec,
        "durable_spaces.campaigns.run:run_one",
        out_dir=tmp_path / "out",
        jobs=2,
        progress=False,
        stdout=out,
        retries=0,
    )
    bad = {r.run_id: r.checks for r in result.records if r.outcome != "ok"}
    assert not bad, bad
    line = out.getvalue().strip().splitlines()[-1]
    s = Summary.parse(line)
    assert (s.mode, s.runs, s.ok) == ("redrive", 3, 3), line
    assert list(s.extra) == list(SUMMARY_FIELDS), line
    assert int(s.extra["races"]) == 1  # the race's second session waited, then drove
    assert int(s.extra["drives"]) >= 5  # two sessions in the race, a re-drive after the kill
    assert s.extra["lease_violations"] == s.extra["epoch_violations"] == "0"
    assert s.faults.get("db_restart") == 1 and s.faults.get("race") == 1
    assert s.resume_p50_ms is not None  # the driver kill's resume was measured


def test_other_scenarios_summary_lines_carry_no_cluster_fields(tmp_path: Path) -> None:
    from durable_spaces.campaigns.scenarios import registration

    assert registration("random").summary_fields == ()
    assert registration("stale").summary_fields == ()
    line = Summary.of([], mode="transactional", backend="local", seed_base="x").line()
    assert line.endswith("seed_base=x")


def _drive(s: ClusterStore, name: str) -> int:
    s.claim_session("c1", 30.0, name)
    d = s.begin_drive(name, "c1")
    assert d.epoch is not None
    return d.epoch


def test_a_second_holder_let_in_by_a_broken_fence_is_a_lease_violation(
    stores: OpenStore, pg_url: str
) -> None:
    s = stores()
    s.register_host("h1", "10.1.0.1:7000", "local")
    s.create_space("sp")
    s.create_session("a", "sp")
    s.create_session("b", "sp")
    _drive(s, "a")
    assert not s.acquire_lease("sp", "b").granted  # the fence holds: b waits
    assert tally(s.events()).counters()["lease_violations"] == 0
    # Break the fence: a's live lease is made to look expired, so b is let in while a's
    # session is open and its lease never released.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE ds.leases SET expires_at = now() - interval '1 second'")
    assert s.acquire_lease("sp", "b").granted
    t = tally(s.events())
    assert t.counters()["lease_violations"] == 1
    assert [a["name"] for a in t.lease] == ["two_holders"]
    assert t.verdicts()["no_lease_violations"]["valid"] is False
    # a's driver of token 1 stepping after token 2 was granted: a stale holder worked
    time.sleep(0.02)
    s.record_event("driver_first_step", session="a", epoch=1, unix_ms=time.time() * 1000)
    assert sorted(a["name"] for a in tally(s.events()).lease) == ["stale_token_used", "two_holders"]


def test_an_epoch_issued_again_and_a_stale_launch_are_epoch_violations(
    stores: OpenStore, pg_url: str
) -> None:
    s = stores()
    s.create_session("s")  # no Space: epochs are previous + 1
    assert _drive(s, "s") == 1
    s.record_event("driver_launched", session="s", epoch=1, pid=1, unix_ms=time.time() * 1000)
    assert tally(s.events()).counters()["epoch_violations"] == 0
    # Break durability: the session's epoch is lost (the schema's own guard against
    # that, session_epoch_monotonic, switched off first), so epoch 1 is issued again.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE ds.sessions DISABLE TRIGGER session_epoch_monotonic")
        conn.execute("UPDATE ds.sessions SET epoch = 0")
    assert _drive(s, "s") == 1
    t = tally(s.events())
    assert [a["name"] for a in t.epoch] == ["epoch_not_increasing"]
    assert t.verdicts()["no_epoch_violations"]["valid"] is False
    # epoch 1 launched again, after epoch 1 was issued again: two drivers for one epoch
    s.record_event("driver_launched", session="s", epoch=1, pid=2, unix_ms=time.time() * 1000)
    names = sorted(a["name"] for a in tally(s.events()).epoch)
    assert names == ["epoch_not_increasing", "two_drivers_one_epoch"]


def test_a_driver_launched_after_a_newer_epoch_was_issued_is_a_stale_launch(
    stores: OpenStore,
) -> None:
    s = stores()
    s.create_session("s")
    _drive(s, "s")
    before = time.time() * 1000
    assert _drive(s, "s") == 2
    time.sleep(0.02)
    s.record_event("driver_launched", session="s", epoch=2, pid=2, unix_ms=time.time() * 1000)
    assert tally(s.events()).epoch == []
    s.record_event("driver_launched", session="s", epoch=1, pid=1, unix_ms=before)
    assert tally(s.events()).epoch == []  # launched before epoch 2 existed: not stale
    s.record_event("driver_launched", session="s", epoch=1, pid=3, unix_ms=time.time() * 1000)
    names = sorted(a["name"] for a in tally(s.events()).epoch)
    assert names == ["stale_launch", "two_drivers_one_epoch"]


@pytest.mark.parametrize("backend", ["docker"])
def test_the_scenario_refuses_a_backend_its_hosts_cannot_provide(
    backend: str, tmp_path: Path
) -> None:
    import asyncio

    from durable_spaces.campaigns.run import run_one

    run = CampaignSpec(scenario="redrive", backend=backend, runs=1, seed_base="x").run(
        0, str(tmp_path)
    )
    rec = asyncio.run(run_one(run))
    assert rec.outcome == "lab_error"
    assert "runs on local or spacesd hosts, not docker" in rec.checks["run"]["detail"]


def test_every_superseded_token_offered_again_is_refused_and_counted(stores: OpenStore) -> None:
    from durable_spaces.campaigns.scenarios.redrive import probe_superseded

    s = stores()
    s.register_host("h1", "10.1.0.1:7000", "local")
    s.create_space("sp")
    s.create_session("a", "sp")
    for _ in range(3):  # three drives: tokens 1, 2 superseded by 3
        _drive(s, "a")
    assert probe_superseded(s, "sp") == []
    t = tally(s.events())
    assert t.tokens_refused == 6  # renew, connect and release of tokens 1 and 2
    assert s.lease("sp").token == 3 and s.lease("sp").holder == "a"  # nothing changed
