"""Run records and reports read from a campaign directory as data from outside: a file
that is not a record (not JSON, the wrong shape, a field of the wrong type, too big) is
skipped with its reason and counted, the rest still make the report; nothing is written
through a symlink planted among the outputs; strings from records cannot break the
report's Markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tree_snapshot import tree

from durable_spaces.campaigns.record import (
    MAX_RECORD_BYTES,
    RunRecord,
    load_records,
    scan_records,
)
from durable_spaces.campaigns.summary import Summary
from durable_spaces.errors import RecordError
from durable_spaces.reports.render import render_report


def _good(**fields: Any) -> dict[str, Any]:
    d = RunRecord("run-0001", "s-1", "transactional", "local", 3).to_json()
    d.update(fields)
    return d


NOT_JSON = {
    "empty-file": b"",
    "truncated": b'{"run_id": "run-0001", "se',
    "binary": b"\x00\xff\xfe",
    "invalid-utf8": b'{"run_id": "run-\xff"}',
}
WRONG_SHAPE: dict[str, Any] = {
    "a-list": [],
    "a-string": "run-0001",
    "null": None,
    "a-number": 7,
    "missing-seed": {k: v for k, v in _good().items() if k != "seed"},
    "missing-run-id": {k: v for k, v in _good().items() if k != "run_id"},
}
WRONG_TYPES: dict[str, tuple[dict[str, Any], str]] = {
    "calls-string": (_good(calls="3"), "calls"),
    "calls-negative": (_good(calls=-1), "calls"),
    "calls-bool": (_good(calls=True), "calls"),
    "kills-float": (_good(kills=1.5), "kills"),
    "seed-int": (_good(seed=17), "seed"),
    "mode-null": (_good(mode=None), "mode"),
    "faults-list": (_good(faults=["kill"]), "faults"),
    "faults-count-string": (_good(faults={"kill": "1"}), "faults"),
    "faults-kind-with-space": (_good(faults={"daemon kill": 1}), "faults"),
    "recoveries-kind-with-colon": (_good(recoveries={"ran:1": 1}), "recoveries"),
    "latencies-not-a-list": (_good(resume_latencies_ms=12.5), "resume_latencies_ms"),
    "latencies-string-element": (_good(resume_latencies_ms=[1.0, "2"]), "resume_latencies_ms"),
    "latencies-nan": (_good(resume_latencies_ms=[float("nan")]), "resume_latencies_ms"),
    "backoffs-bool": (_good(resume_backoffs_ms=[True]), "resume_backoffs_ms"),
    "outcome-unknown": (_good(outcome="great"), "outcome"),
    "checks-a-list": (_good(checks=[]), "checks"),
    "check-not-an-object": (_good(checks={"x": True}), "checks"),
    "check-valid-a-string": (_good(checks={"x": {"valid": "yes"}}), "checks"),
    "duration-infinite": (_good(duration_s=float("inf")), "duration_s"),
    "repro-a-list": (_good(repro=["durable-spaces"]), "repro"),
    "schedule-a-list": (_good(schedule=[1]), "schedule"),
    "extra-a-list": (_good(extra=[]), "extra"),
    "recoveries-by-mode-bad": (_good(extra={"recoveries_by_mode": {"auto/ran": "x"}}), "extra"),
    "space-missing-not-a-reason": (_good(extra={"space_missing": {"f": 1}}), "extra"),
    "space-missing-a-list": (_good(extra={"space_missing": ["f"]}), "extra"),
    "durable-mode-int": (_good(durable_mode=1), "durable_mode"),
    "run-id-a-path": (_good(run_id="../../etc/x"), "run_id"),
    "run-id-int": (_good(run_id=1), "run_id"),
}


def _campaign(tmp_path: Path, bad: bytes) -> tuple[Path, Path]:
    """A campaign directory with one good record (run-0000) and ``bad`` as run-0001."""
    d = tmp_path / "c"
    RunRecord("run-0000", "s-0", "transactional", "local", 3, kills=1, faults={"kill": 1},
              resume_latencies_ms=[120.0]).save(d / "runs")  # fmt: skip
    bad_path = d / "runs" / "run-0001.json"
    bad_path.write_bytes(bad)
    return d, bad_path


def _check_skipped(tmp_path: Path, data: bytes, why: str, *, render: bool = True) -> None:
    d, bad = _campaign(tmp_path, data)
    with pytest.raises(RecordError) as err:
        RunRecord.load(bad)
    assert str(bad) in str(err.value) and why in str(err.value)
    scan = scan_records(d)
    assert [r.run_id for r in scan.records] == ["run-0000"]
    assert [p for p, _ in scan.skipped] == [bad] and why in scan.skipped[0][1]
    if render:  # (all the wrong types at once: test_one_report_skips_and_counts_them_all)
        rep = render_report(d)  # never crashes, still reports the good run
        assert rep.runs == 1 and [p for p, _ in rep.skipped] == [bad]
        md = rep.markdown.read_text()
        assert "## Skipped files" in md and "run-0001.json" in md
    Summary.of(scan.records, mode="transactional", backend="local", seed_base="s").line()
    with pytest.raises(RecordError):
        load_records(d)  # the strict reader names the first bad file


@pytest.mark.parametrize("data", NOT_JSON.values(), ids=NOT_JSON.keys())
def test_a_record_file_that_is_not_json_is_skipped(data: bytes, tmp_path: Path) -> None:
    _check_skipped(tmp_path, data, "not JSON")


@pytest.mark.parametrize("obj", WRONG_SHAPE.values(), ids=WRONG_SHAPE.keys())
def test_a_record_of_the_wrong_shape_is_skipped(obj: Any, tmp_path: Path) -> None:
    why = "missing" if isinstance(obj, dict) else "JSON object"
    _check_skipped(tmp_path, json.dumps(obj).encode(), why)


@pytest.mark.parametrize(("obj", "field"), WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
def test_a_record_with_a_field_of_the_wrong_type_is_skipped_naming_it(
    obj: dict[str, Any], field: str, tmp_path: Path
) -> None:
    _check_skipped(tmp_path, json.dumps(obj).encode(), repr(field)[1:-1], render=False)


def test_one_report_skips_and_counts_them_all(tmp_path: Path) -> None:
    d, first = _campaign(tmp_path, json.dumps(_good(calls="3")).encode())
    bad = [first]
    for i, (obj, _) in enumerate(WRONG_TYPES.values(), start=2):
        bad.append(d / "runs" / f"run-{i:04d}.json")
        bad[-1].write_text(
            json.dumps(
                {**obj, "run_id": f"run-{i:04d}"} if obj.get("run_id") == "run-0001" else obj
            )
        )
    rep = render_report(d)
    assert rep.runs == 1 and sorted(p for p, _ in rep.skipped) == sorted(bad)


def test_a_huge_record_file_is_skipped_without_reading_it_whole(tmp_path: Path) -> None:
    _check_skipped(tmp_path, b" " * (MAX_RECORD_BYTES + 1), "over")


def test_a_second_record_of_the_same_run_is_skipped(tmp_path: Path) -> None:
    d, bad = _campaign(tmp_path, json.dumps(_good(run_id="run-0000")).encode())
    scan = scan_records(d)
    assert len(scan.records) == 1 and scan.skipped == [(bad, "a second record of run run-0000")]


def test_a_malformed_campaign_json_is_ignored_and_named(tmp_path: Path) -> None:
    d, _ = _campaign(tmp_path, json.dumps(_good()).encode())
    (d / "campaign.json").write_text("[1, 2")
    rep = render_report(d)
    assert rep.runs == 2 and (d / "campaign.json", "not JSON") in [
        (p, w.split(" (")[0]) for p, w in rep.skipped
    ]


@pytest.mark.parametrize(
    "name", ["report.md", "report.html", "resume_latency.png", "recoveries.png"]
)
def test_an_output_symlink_is_replaced_not_followed(
    name: str, tmp_path: Path, outside: Path
) -> None:
    d, _ = _campaign(tmp_path, json.dumps(_good()).encode())
    (d / name).symlink_to(outside / "precious")
    before = tree(outside)
    render_report(d)
    assert tree(outside) == before
    assert not (d / name).is_symlink() and (d / name).stat().st_size > 0


def test_strings_from_a_record_cannot_break_the_markdown(tmp_path: Path) -> None:
    evil = "durable-spaces repro --seed s-1`\n## Injected heading\n`` |"
    d, _ = _campaign(tmp_path, json.dumps(_good(outcome="failed", repro=evil)).encode())
    md = render_report(d).markdown.read_text()
    assert "\n## Injected heading" not in md
    (line,) = [ln for ln in md.splitlines() if ln.startswith("- `run-0001`")]
    assert line.startswith("- `run-0001`") and "```" in line  # a fence longer than any run


def test_save_refuses_a_run_id_that_is_a_path(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="safe file name"):
        RunRecord("../escape", "s", "transactional", "local", 1).save(tmp_path / "runs")
    assert not (tmp_path / "escape.json").exists()


def test_a_valid_record_round_trips(tmp_path: Path) -> None:
    r = RunRecord.from_json(
        _good(faults={"kill": 2}, resume_latencies_ms=[1, 2.5], checks={"x": {"valid": None}})
    )
    back = RunRecord.load(r.save(tmp_path))
    assert back == r and back.checks["x"] == {"valid": None, "detail": ""}


# --- a run read back (a record replayed, a spec from the queue) is checked as flags are ---

_SPEC = {"run_id": "run-0001", "seed": "s-1", "mode": "transactional", "backend": "local",
         "calls": 3, "durable_mode": "transactional", "profile": "default", "state_dir": "",
         "index": 1, "schedule": None, "scenario": ""}  # fmt: skip
BAD_SPECS: dict[str, tuple[dict[str, Any], str]] = {
    "calls-absurd": ({"calls": 10**9}, "over the limit of 10000"),
    "calls-zero": ({"calls": 0}, "at least 1"),
    "calls-string": ({"calls": "3"}, "not an integer"),
    "calls-bool": ({"calls": True}, "not an integer"),
    "calls-float": ({"calls": 3.0}, "not an integer"),
    "index-negative": ({"index": -1}, "run index"),
    "index-a-string": ({"index": "1"}, "run index"),
    "run-id-a-path": ({"run_id": "../x"}, "safe file name"),
    "seed-a-shell": ({"seed": "$(id)"}, "one word"),
    "mode-unknown": ({"mode": "chaotic"}, "--mode"),
    "mode-a-number": ({"mode": 1}, "is not a name"),
    "backend-unknown": ({"backend": "vmware"}, "--backend"),
    "profile-unknown": ({"profile": "brutal"}, "--profile"),
    "durable-mode-unknown": ({"durable_mode": "maybe"}, "--durable-mode"),
    "scenario-unknown": ({"scenario": "chaos"}, "--scenario"),
    "state-dir-a-list": ({"state_dir": ["/"]}, "not a path"),
    "schedule-hit-absurd": (
        {
            "schedule": {
                "seed": "s-1",
                "attempts": [{"failpoint": {"name": "adapter.spawn", "n": 10**12}}],
            }
        },
        "hit number",
    ),
    "schedule-delay-nan": (
        {"schedule": {"seed": "s-1", "attempts": [{"kill_after_s": [float("nan")]}]}},
        "kill_after_s",
    ),
    "schedule-delay-negative": (
        {"schedule": {"seed": "s-1", "attempts": [{"kill_after_s": [-1]}]}},
        "kill_after_s",
    ),
    "schedule-attempts-absurd": (
        {"schedule": {"seed": "s-1", "attempts": [{}] * 1001}},
        "1001 attempts",
    ),
}


@pytest.mark.parametrize(("changes", "why"), BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_a_run_spec_read_back_is_checked_as_the_flags_are(
    changes: dict[str, Any], why: str
) -> None:
    """What a campaign worker reads from the queue, and what ``repro --exact`` builds
    from a record, go through ``spec.check_run``: the flags' checks and words."""
    from durable_spaces.campaigns.spec import RunSpec
    from durable_spaces.errors import ConfigError

    RunSpec.from_json(_SPEC)  # the control
    with pytest.raises(ConfigError, match=why.replace("$", r"\$")):
        RunSpec.from_json({**_SPEC, **changes})
