"""Harnesses that come back after a crash in ways of their own (fakes/nodeagent.mjs,
fakes/lazyagent.py), graded by what they did: one that resumes with a fresh conversation
summarising its calls never runs a step again, and is not blamed for the model's choices;
one that writes its transcript only when the next answer arrives shows a killed request's
output to nobody; one that asks the model again after a crash runs a call again, which the
older per-step call ids hid. Each under the kill faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.probe.helpers import KILL_FAULTS, fake, probe


@pytest.mark.parametrize("fault", KILL_FAULTS)
def test_a_fresh_conversation_summarising_the_calls(tmp_path: Path, fault: str) -> None:
    p = probe(tmp_path / "o", "--harness", fake("fresh"), "--scenario", "exhaustive",
              "--steps", "2", "--fault", fault,
              "--at", "started,effect,exited,request")  # fmt: skip
    assert p.code == 0, p.stdout + p.stderr
    s = p.summary
    # the model read the summary: it asked for no step it had seen done, so nothing twice
    assert s["duplicate"] == "0" and s["lost"] == "0" and s["unverified"] == "0", p.stdout
    assert s["grade"] == "partial:at-most-once-reported", p.stdout
    killed = [r for r in p.records() if r.point and r.point.where in ("effect", "exited")]
    assert killed and all(
        next(x for x in r.results if x.step == r.point.step).cls == "reported" for r in killed
    )


@pytest.mark.parametrize("fault", KILL_FAULTS)
def test_output_only_in_a_request_never_answered(tmp_path: Path, fault: str) -> None:
    p = probe(tmp_path / "o", "--harness", fake("lazy"), "--scenario", "exhaustive",
              "--steps", "1", "--fault", fault, "--at", "request,stream")  # fmt: skip
    assert p.code == 0, p.stdout + p.stderr
    by = {str(r.point): r.results[0] for r in p.records() if r.point}
    # killed while request 2 (step 1's output) was out: its transcript never kept the
    # output, and every request the model answered said the call was cut off
    for point in ("request@2", "stream@2"):
        assert (by[point].shown, by[point].cls, by[point].effects) == ("reported", "reported", 1)
    assert by["request@1"].cls == "once"
    assert p.summary["grade"] == "partial:at-most-once-reported", p.stdout


@pytest.mark.parametrize("fault", KILL_FAULTS)
def test_a_harness_that_asks_again_after_a_crash(tmp_path: Path, fault: str) -> None:
    args = ("--harness", fake("reask"), "--scenario", "exhaustive", "--steps", "1",
            "--fault", fault, "--at", "effect")  # fmt: skip
    p = probe(tmp_path / "o", *args)
    assert p.code == 0, p.stdout + p.stderr
    (r1,) = [r for r in p.records() if r.point]
    # it dropped the unfinished call and asked again: a new id, so it ran the call again,
    # and the request it asked with showed nothing of the step: the harness's duplicate
    assert (r1.results[0].cls, r1.results[0].asks, r1.results[0].episodes) == ("duplicate", 2, 1)
    assert r1.call_ids == "per-answer"
    # the older ids, the step's own: the model's new answer carries the id it started,
    # and it reports instead of running: the flag hides what it does with a real model
    old = probe(tmp_path / "old", *args, "--call-ids", "per-step")
    assert old.code == 0, old.stdout + old.stderr
    (r1,) = [r for r in old.records() if r.point]
    assert r1.results[0].cls == "reported" and r1.call_ids == "per-step"
    assert "per-step (the step's own" in (old.out / "report.md").read_text()
