"""Model-side faults, graded by what they do to the workspace: an HTTP 500, an answer cut
partway, a late answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.probe.helpers import fake, probe


@pytest.mark.parametrize(
    ("fault", "points"),
    [("model-5xx", ["request@1", "request@2"]), ("model-cut", ["stream@1", "stream@2"]),
     ("model-slow", ["request@1", "request@2"])],
)  # fmt: skip
def test_model_faults_land_where_they_apply(tmp_path: Path, fault: str, points: list[str]) -> None:
    p = probe(tmp_path / "o", "--harness", fake("correct"), "--scenario", "exhaustive",
              "--steps", "1", "--fault", fault)  # fmt: skip
    assert p.code == 0, p.stdout + p.stderr
    recs = p.records()[1:]
    assert [str(r.point) for r in recs] == points and all(r.landed for r in recs)
    assert p.summary["grade"] in ("exactly-once", "at-most-once-reported")
    if fault == "model-slow":  # a late answer is only late
        assert all(len(r.attempts) == 1 for r in recs)
    if fault == "model-5xx":  # the fake does not retry a request: it fails and is resumed
        assert all(len(r.attempts) == 2 for r in recs)
