"""``durable-spaces campaign --db``: the runs go on the cluster's queue, two workers in two
network namespaces take them, one machine is lost mid-run, and the campaign still ends
with every run's record, its SUMMARY and its report, each run counted once."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from durable_spaces.campaigns.cluster.lab import CLI, wait_for
from durable_spaces.campaigns.record import RunRecord


def _worker(cluster: Any, wid: str, campaign: str) -> tuple[Any, subprocess.Popen[bytes]]:
    ns = cluster.lab.add_host()
    argv = [*CLI, "worker", "--db", cluster.url, "--id", wid, "--claim-ttl", "3"]
    argv += ["--work-dir", str(cluster.root / wid), "--campaign", campaign]
    with open(cluster.root / f"{wid}.log", "ab") as log:
        proc = ns.popen(argv, stdout=log, stderr=subprocess.STDOUT)
    cluster.procs.append(proc)
    return ns, proc


def _queued_campaign(cluster: Any) -> str:
    got = wait_for("the campaign's runs on the queue", lambda: cluster.events("run_queued"), 60)
    return str(got[0].detail["campaign"])


def test_a_queued_campaign_survives_a_lost_worker(cluster: Any, tmp_path: Path) -> None:
    out = tmp_path / "qc"
    argv = [*CLI, "campaign", "--db", cluster.url, "--backend", "local", "--runs", "3"]
    argv += ["--calls", "4", "--seed-base", "qc", "--profile", "calm", "--out", str(out)]
    argv += ["--no-progress", "--run-timeout", "300"]
    camp = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cluster.procs.append(camp)
    name = _queued_campaign(cluster)
    assert name.startswith("qc-")
    ns1, _ = _worker(cluster, "w1", name)
    first = wait_for("w1's first run", lambda: cluster.events("run_claimed"), 90)[0]
    _worker(cluster, "w2", name)
    ns1.lose()  # w1's machine, with its run's processes, is gone mid-run
    stdout, stderr = camp.communicate(timeout=400)
    assert camp.returncode == 0, stderr.decode()[-3000:]
    summary = stdout.decode().strip().splitlines()[-1]
    assert summary.startswith("SUMMARY ") and " runs=3 ok=3 failed=0 " in summary, summary
    records = sorted(out.glob("runs/run-*.json"))
    assert [p.name for p in records] == ["run-0000.json", "run-0001.json", "run-0002.json"]
    for p in records:
        assert RunRecord.from_json(json.loads(p.read_text())).outcome == "ok"
    assert (out / "report.md").is_file()
    stored = {r.id: r for r in cluster.store.runs(name)}
    taken = stored[first.detail["run"]]
    assert (taken.attempts, taken.worker) == (2, "w2")  # given back once its claim lapsed
    finished = sorted(e.detail["run"] for e in cluster.events("run_finished"))
    assert finished == sorted(stored), "a run's record stored more than once"


def test_db_with_determinism_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    out = tmp_path / "never"
    argv = [*CLI, "campaign", "--db", "postgresql://nowhere/x", "--determinism", "2"]
    proc = subprocess.run([*argv, "--out", str(out)], capture_output=True, timeout=60)
    assert proc.returncode == 2
    assert b"--db and --determinism" in proc.stderr and b"Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("bad", ["no url at all", "postgresql://127.0.0.1:1/none"])
def test_an_unreachable_db_is_one_line(tmp_path: Path, bad: str) -> None:
    argv = [*CLI, "campaign", "--db", bad, "--runs", "1", "--out", str(tmp_path / "o")]
    proc = subprocess.run([*argv, "--no-progress"], capture_output=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(b"durable-spaces: error: "), proc.stderr
    assert b"Traceback" not in proc.stderr
