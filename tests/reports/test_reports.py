"""Reports from a synthetic campaign directory."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from durable_spaces.campaigns.record import Check, RunRecord
from durable_spaces.reports.render import markdown_table, render_report
from durable_spaces.reports.tables import (
    attempts_table,
    faults_table,
    latency_table,
    missing_table,
    outcomes_table,
    recoveries_table,
)


def synthetic(tmp_path: Path) -> list[RunRecord]:
    recs = []
    for i in range(12):
        mode = "transactional" if i % 2 else "checkpoint"
        recs.append(
            RunRecord(
                run_id=f"run-{i:04d}",
                seed=f"syn-{i}",
                mode=mode,
                backend="local",
                calls=5,
                faults={"kill": 1 + i % 3, **({"space_remove": 1} if i % 4 == 0 else {})},
                kills=1 + i % 3,
                recoveries={"adopted": i % 3, **({"restored": 1} if i % 4 == 0 else {})},
                attempts=2 + i % 3,
                resume_latencies_ms=[100.0 + 10 * i, 150.0 + i],
                resume_backoffs_ms=[50.0, 50.0] if i % 2 else [],
                outcome="failed" if i == 5 else "ok",
                checks={"exactly_once": Check(valid=i != 5, detail="")},
                repro=f"durable-spaces repro --mode {mode} --seed syn-{i} --calls 5",
            )
        )
    for r in recs:
        r.save(tmp_path / "runs")
    return recs


def test_tables(tmp_path: Path) -> None:
    recs = synthetic(tmp_path)
    f = faults_table(recs).set_index("fault")
    assert f.loc["kill", "total"] == sum(1 + i % 3 for i in range(12))
    assert f.loc["space_remove", "checkpoint"] == 3 and f.loc["space_remove", "transactional"] == 0
    rv = recoveries_table(recs).set_index("recovery")
    assert rv.loc["restored", "total"] == 3
    a = attempts_table(recs)
    assert a.to_dict("records") == [
        {"attempts": 2, "runs": 4},
        {"attempts": 3, "runs": 4},
        {"attempts": 4, "runs": 4},
    ]
    lat = latency_table(recs).set_index("mode")
    assert lat.loc["checkpoint", "samples"] == 12
    assert lat.loc["transactional", "max_ms"] == 210.0
    assert lat.loc["checkpoint", "p50_ms"] <= lat.loc["checkpoint", "p95_ms"]
    # only the transactional runs recorded their backoffs (50 ms each)
    assert (
        lat.loc["transactional", "p50_excl_backoff_ms"] == lat.loc["transactional", "p50_ms"] - 50
    )
    assert pd.isna(lat.loc["checkpoint", "p50_excl_backoff_ms"])
    o = outcomes_table(recs).set_index("mode")
    assert o.loc["transactional", "failed"] == 1 and o.loc["checkpoint", "ok"] == 6
    assert (o["runs"] == 6).all()


def test_render_writes_markdown_html_and_pngs(tmp_path: Path) -> None:
    synthetic(tmp_path)
    rep = render_report(tmp_path)
    md = rep.markdown.read_text()
    assert "## Resume latency (ms)" in md and "| fault | checkpoint | transactional | total |" in md
    assert "--seed syn-5" in md  # the failed run's repro
    html = rep.html.read_text()
    assert html.count("data:image/png;base64,") == 2
    assert "<table" in html
    for p in rep.images:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_empty_campaign_still_renders(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    rep = render_report(tmp_path)
    assert "_(none)_" in rep.markdown.read_text()


def test_markdown_table_escapes_pipes() -> None:
    import pandas as pd

    assert markdown_table(pd.DataFrame({"a": ["x|y"]})) == "| a |\n| --- |\n| x\\|y |"


def test_a_space_feature_missing_is_reported_with_why(tmp_path: Path) -> None:
    """A local Space without cgroups (its record's ``space_missing``) is a row: backend,
    feature, why, runs; Spaces that lacked nothing add none."""
    why = "no cgroup v2 hierarchy is mounted"
    recs = synthetic(tmp_path)
    for r in recs[:3]:
        r.extra["space_missing"] = {"process.contained_epochs": why}
        r.save(tmp_path / "runs")
    recs[3].extra["space_missing"] = {}
    recs[3].save(tmp_path / "runs")
    t = missing_table(recs)
    assert t.to_dict("records") == [
        {"backend": "local", "feature": "process.contained_epochs", "why": why, "runs": 3}
    ]
    md = render_report(tmp_path).markdown.read_text()
    assert f"| local | process.contained_epochs | {why} | 3 |" in md
