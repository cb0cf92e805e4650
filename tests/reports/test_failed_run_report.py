"""A campaign's report with a failed run (the ``rerun_exited`` mutant: a command that
exited before its driver was killed runs again): its timeline shows the call's two
executions and the recovery decision between them; the HTML opens in a real browser
with the coverage table, the timeline and no horizontal overflow."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from durable_spaces.campaigns.run import run_one
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.chaos.schedule import AttemptPlan, PointFault, Schedule
from durable_spaces.reports.render import render_report

ARTIFACTS = Path(os.environ.get("DS_TEST_ARTIFACTS", "test-artifacts"))


def _failed_campaign(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DS_MUTANTS", "rerun_exited")
    sched = Schedule("mx", (AttemptPlan(at_points=(PointFault("adapter.exit", 1, "kill"),)),))
    spec = RunSpec(run_id="run-0000", seed="mx", mode="transactional", backend="local",
                   calls=3, durable_mode="transactional", state_dir=str(tmp / "state"),
                   schedule=sched)  # fmt: skip
    record = asyncio.run(run_one(spec))
    monkeypatch.delenv("DS_MUTANTS")
    assert record.outcome == "failed", record.checks
    out = tmp / "campaign"
    record.save(out / "runs")
    return out


@pytest.fixture(scope="module")
def failed_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mp = pytest.MonkeyPatch()
    try:
        out = _failed_campaign(tmp_path_factory.mktemp("failed"), mp)
    finally:
        mp.undo()
    render_report(out)
    return out


def test_the_timeline_holds_both_executions_and_the_recovery_between(failed_report: Path) -> None:
    from durable_spaces.campaigns.record import RunRecord

    rec = RunRecord.load(failed_report / "runs" / "run-0000.json")
    stories = rec.extra["trace"]
    assert [s["exit_code"] for s in stories][:1] == [-9]
    assert stories[0]["ended_at"]["point"] == "adapter.exit"
    killed_call = stories[0]["ended_at"]["call"]
    again = [c for c in stories[1]["calls"] if c["call"] == killed_call]
    assert again and "adapter.spawn" in again[0]["points"], "the second execution"
    call_id = killed_call.split(":", 1)[1]
    assert f"{stories[1]['epoch']}:ran:{call_id}" in rec.extra["recovery_sequence"]
    page = (failed_report / "failed" / "run-0000.html").read_text()
    assert "data:image/png;base64," in page and "duplicate_effect" in page
    assert "repro --exact" in page
    report = (failed_report / "report.html").read_text()
    assert "failed/run-0000.html" in report and "Coverage: failpoints passed" in report
    assert (failed_report / "failed" / "run-0000.png").stat().st_size > 1000


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.chromium  # tests/needs.py: a skip outside CI, a failure on CI
def test_the_report_opens_in_a_browser_without_overflow(failed_report: Path) -> None:
    assert CHROMIUM is not None
    probe = failed_report / "probe.html"
    script = (
        "<script>window.addEventListener('load',()=>{const e=document.documentElement;"
        "document.title='W'+e.scrollWidth+'/'+e.clientWidth"
        "+' T'+document.querySelectorAll('table').length"
        "+' I'+Array.from(document.images).filter(i=>i.naturalWidth>0&&i.alt==='timeline').length"
        "+' C'+(document.body.innerText.includes('Coverage: failpoints passed')?1:0)});</script>"
    )
    probe.write_text(
        (failed_report / "report.html").read_text().replace("</body>", script + "</body>")
    )
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--window-size=1024,900", "--virtual-time-budget=5000"]  # fmt: skip
    dom = subprocess.run([*base, "--dump-dom", probe.as_uri()], capture_output=True,
                         text=True, timeout=120, check=True).stdout  # fmt: skip
    m = re.search(r"<title>W(\d+)/(\d+) T(\d+) I(\d+) C(\d)</title>", dom)
    assert m is not None, dom[:500]
    scroll, client, tables, timelines, coverage = map(int, m.groups())
    assert scroll <= client, f"horizontal overflow: {scroll} > {client}"
    assert coverage == 1 and tables >= 3 and timelines == 1
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    page = (failed_report / "report.html").as_uri()
    subprocess.run([*base, f"--screenshot={shot.resolve()}", page],
                   capture_output=True, timeout=120, check=True)  # fmt: skip
    assert shot.stat().st_size > 10_000
