"""A probe with the harness's own file tools, its report, --compare, and repro of a run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from typer.testing import CliRunner

from durable_spaces import cli
from durable_spaces.probe.report import find
from tests.probe.helpers import fake, probe, write_recipe


def test_file_tools_report_compare_and_repro(tmp_path: Path) -> None:
    p = probe(tmp_path / "o", "--harness", fake("files"), "--runs", "2", "--steps", "4",
              "--seed-base", "ft", "--fault", "machine", "--keep")  # fmt: skip
    assert p.code == 0, p.stdout + p.stderr
    first = p.records()[0]
    assert [(x.kind, x.cls) for x in first.results] == [
        ("append", "once"),
        ("write", "once"),
        ("long", "once"),
        ("edit", "once"),
    ]
    notes = (tmp_path / "o" / "work" / "r0" / "work" / "notes.txt").read_text()
    assert notes.startswith("W p") and "\nE p" in notes and "slot" not in notes
    # the same seed base plans the same points
    again = probe(tmp_path / "o2", "--harness", fake("files"), "--runs", "2", "--steps", "4",
                  "--seed-base", "ft", "--fault", "machine")  # fmt: skip
    assert [r.point for r in again.records()] == [r.point for r in p.records()]
    md = (tmp_path / "o" / "report.md").read_text()
    assert "| kill point | runs | once |" in md and "promise: at-most-once-reported" in md
    assert "<table>" in (tmp_path / "o" / "report.html").read_text()
    r = CliRunner().invoke(cli.app, ["probe", "--compare", str(tmp_path / "o"),
                                     str(tmp_path / "o2")])  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = r.stdout.strip().splitlines()
    assert rows[0].startswith("| harness | fault |") and len(rows) == 4
    assert rows[2].startswith("| fake-files | machine | random | 3 |")
    r = CliRunner().invoke(cli.app, ["probe", "--compare", str(tmp_path)])
    assert r.exit_code == 2 and "is not a probe directory" in r.stderr
    r = CliRunner().invoke(cli.app, ["probe", "--compare", "fake-nothing"])
    assert r.exit_code == 2 and "neither a probe directory nor a harness probed" in r.stderr
    named = tmp_path / "po" / "fake-files-20261205"
    named.mkdir(parents=True)
    (named / "probe.json").write_text((tmp_path / "o" / "probe.json").read_text())
    assert find(Path("fake-files"), tmp_path / "po") == named


def test_a_failed_run_replays_from_its_repro_line(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r", "rerun")
    p = probe(tmp_path / "o", "--harness", str(recipe), "--scenario", "exhaustive",
              "--steps", "1", "--at", "effect")  # fmt: skip
    (line,) = [x for x in p.stdout.splitlines() if x.startswith("REPRO ")]
    assert line.startswith("REPRO r1 (duplicate@1; process at effect@1): durable-spaces repro ")
    argv = shlex.split(line.split(": ", 1)[1])
    r = CliRunner().invoke(cli.app, [*argv[1:], "--state-dir", str(tmp_path / "again")])
    assert r.exit_code == 1, r.output
    assert r.stdout.strip().endswith("(duplicate@1; process at effect@1) as_recorded=yes")
    rec = json.loads((tmp_path / "again" / "runs" / "r1.json").read_text())
    assert rec["kind"] == "probe" and rec["landed"] is True
