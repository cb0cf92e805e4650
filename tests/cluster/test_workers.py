"""Campaign workers on two machines (network namespaces) pulling runs from the store;
one machine is lost mid-run and its run goes to the other."""

from __future__ import annotations

import subprocess
from typing import Any

from durable_spaces.campaigns.cluster.lab import CLI, wait_for
from durable_spaces.campaigns.cluster.workers import enqueue_runs
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.spec import RunSpec


def _worker(cluster: Any, wid: str) -> tuple[Any, subprocess.Popen[bytes]]:
    ns = cluster.lab.add_host()
    argv = [*CLI, "worker", "--db", cluster.url, "--id", wid, "--claim-ttl", "3"]
    argv += ["--work-dir", str(cluster.root / wid), "--until-empty"]
    with open(cluster.root / f"{wid}.log", "ab") as log:
        proc = ns.popen(argv, stdout=log, stderr=subprocess.STDOUT)
    cluster.procs.append(proc)
    return ns, proc


def test_two_workers_a_lost_one_gives_its_run_back(cluster: Any) -> None:
    runs = [
        RunSpec(f"r{i}", f"wk{i}", "transactional", "local", calls=4, durable_mode="transactional")
        for i in range(3)
    ]
    enqueue_runs(cluster.store, "camp", runs)
    ns1, _ = _worker(cluster, "w1")
    first = wait_for("w1's first run", lambda: cluster.events("run_claimed"), 60)[0]
    assert first.detail["worker"] == "w1"
    _, w2 = _worker(cluster, "w2")
    ns1.lose()  # w1's machine, with its run's processes, is gone mid-run
    w2.wait(240)
    assert w2.returncode == 0, (cluster.root / "w2.log").read_text()[-3000:]
    stored = cluster.store.runs("camp")
    assert [r.state for r in stored] == ["done"] * 3
    taken = {r.id: r for r in stored}[first.detail["run"]]
    assert (taken.attempts, taken.worker) == (2, "w2")  # given back once its claim lapsed
    claims = [
        (e.detail["run"], e.detail["worker"], e.detail["previous"])
        for e in cluster.events("run_claimed")
    ]
    assert (first.detail["run"], "w2", "w1") in claims
    finished = sorted(e.detail["run"] for e in cluster.events("run_finished"))
    assert finished == ["r0", "r1", "r2"]  # each record stored exactly once
    for r in stored:
        assert r.record is not None
        rec = RunRecord.from_json(r.record)
        assert rec.outcome == "ok", rec.checks


def test_a_queued_run_the_flags_would_refuse_is_finished_as_a_lab_error(
    pg_url: str, tmp_path: Any
) -> None:
    """A spec read back from the queue is checked as a campaign's flags are: ``calls``
    of 10**9 is refused (the flag's cap is 10000), the run finished as a lab error that
    says so, nothing started, and the worker goes on."""
    from durable_spaces.campaigns.cluster.workers import ClusterWorker
    from durable_spaces.cluster.store import ClusterStore

    store = ClusterStore(pg_url)
    good = RunSpec("r0", "wk0", "transactional", "local", calls=4).to_json()
    store.enqueue_run("r0", "camp", {**good, "calls": 10**9})
    store.enqueue_run("r1", "camp", {**good, "run_id": "r1", "mode": "chaotic"})
    worker = ClusterWorker(pg_url, "w1", tmp_path / "w", until_empty=True, poll_secs=0.05)
    assert worker.run() == 2
    got = {r.id: RunRecord.from_json(r.record) for r in store.runs("camp")}
    assert {k: v.outcome for k, v in got.items()} == {"r0": "lab_error", "r1": "lab_error"}
    assert "over the limit of 10000" in got["r0"].checks["run"]["detail"]
    assert "transactional, auto, checkpoint" in got["r1"].checks["run"]["detail"]
    assert not list((tmp_path / "w").glob(".r*"))  # no run's process was started
    store.close()
