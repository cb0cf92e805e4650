"""Kill points inside the harness's own state writes (``--at state``): a harness that
rewrites its transcript in place (fakes/nodeagent.mjs --style inplace) and is killed
between the truncate and the write starts over and runs every earlier step again, which no
black-box point shows; one that appends to an fsynced journal (fakes/correct) does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_spaces.probe.faults import machine_unavailable
from tests.probe.helpers import fake, probe

pytestmark = pytest.mark.fuse  # the state directory on powerfs

FAULTS = [
    "process",
    pytest.param("machine", marks=pytest.mark.skipif(
        machine_unavailable() is not None, reason=str(machine_unavailable()))),
    "power",
]  # fmt: skip


@pytest.mark.parametrize("fault", FAULTS)
def test_a_transcript_rewritten_in_place(tmp_path: Path, fault: str, no_leftovers: None) -> None:
    box = probe(tmp_path / "box", "--harness", fake("inplace"), "--scenario", "exhaustive",
                "--steps", "1", "--fault", fault)  # fmt: skip
    assert box.code == 0, box.stdout + box.stderr
    assert box.summary["grade"] == "at-most-once-reported", box.stdout  # looks honest
    state = probe(tmp_path / "state", "--harness", fake("inplace"), "--scenario", "exhaustive",
                  "--steps", "1", "--fault", fault, "--at", "write")  # fmt: skip
    assert state.code == 0, state.stdout + state.stderr
    first = state.records()[0]
    assert {o["path"] for o in first.state_ops} >= {"/transcript.json", "/started.jsonl"}
    if fault == "power":
        # the truncate was never made durable: the cut takes it back with the half-written
        # document, the last fsynced one is what the harness finds (powerfs keeps POSIX's
        # letter; a file system that persists the truncate would show the process case)
        assert state.summary["grade"] == "partial:at-most-once-reported", state.stdout
        return
    assert state.summary["grade"] == "partial:at-least-once", state.stdout
    bad = [r for r in state.records() if r.point and "duplicate" in r.classes]
    assert bad and all(r.state_hit and r.state_hit["path"] == "/transcript.json" for r in bad)
    md = (state.out / "report.md").read_text()
    table = md.split("## Kill points inside the harness's state writes")[1]
    assert f"| {bad[0].point} | /transcript.json (step " in table


def test_an_fsynced_journal_has_no_unsafe_state_write(tmp_path: Path, no_leftovers: None) -> None:
    p = probe(tmp_path / "o", "--harness", fake("correct"), "--runs", "6", "--steps", "1",
              "--seed-base", "st", "--at", "state", "--jobs", "1")  # fmt: skip
    assert p.code == 0, p.stdout + p.stderr
    s = p.summary
    assert s["duplicate"] == s["lost"] == s["unverified"] == "0", p.stdout
    assert int(s["kills"]) == 6 and s["grade"].startswith("partial:"), p.stdout
    hits = [r.state_hit for r in p.records() if r.point]
    assert all(h and h["op"] == r.point.where and h["n"] == r.point.step
               for h, r in zip(hits, [r for r in p.records() if r.point], strict=True))  # fmt: skip
