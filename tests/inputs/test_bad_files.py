"""Every reader of a file a user names or a record points at, given a FIFO in the file's
place and a document nested far too deep (``durable_spaces/host/bounded.py`` is the one
reader they share): each refuses in one line, or takes the file as absent or torn where
that is what it does with a bad one, and none waits for a FIFO's writer or raises
``RecursionError``. ``tests/host/test_bounded.py`` tests the reader itself; the command
line's reports, repros, probes and checks are at the end."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bad_files import deep_json, deep_toml, fifo, on_a_fifo
from typer.testing import CliRunner

from durable_spaces import cli
from durable_spaces.campaigns.record import RunRecord, scan_records
from durable_spaces.errors import BadFileError, DurableSpacesError

runner = CliRunner()


@dataclass(frozen=True)
class Site:
    """A reader: where its file is (under the test's directory), how to read it there,
    and what it must do with a bad file (``check`` gets the read's value or error)."""

    path: str
    read: Callable[[Path], Any]
    check: Callable[[Any, BaseException | None], bool]
    toml: bool = False
    #: A file of lines, not one document: nesting means nothing to its reader.
    lines: bool = False


def refused(kind: type[BaseException], *words: str) -> Callable[[Any, BaseException | None], bool]:
    def check(_value: Any, error: BaseException | None) -> bool:
        text = str(error)
        return isinstance(error, kind) and "\n" not in text and all(w in text for w in words)

    return check


def returns(expected: Any) -> Callable[[Any, BaseException | None], bool]:
    return lambda value, error: error is None and value == expected


def _run_record(root: Path) -> Any:
    return RunRecord.load(root / "runs" / "run-0001.json")


def _scan(root: Path) -> Any:
    RunRecord("run-0000", "s-0", "transactional", "local", 2).save(root / "runs")
    scan = scan_records(root)
    return [r.run_id for r in scan.records], [p.name for p, _ in scan.skipped]


def _schedule(root: Path) -> Any:
    from durable_spaces.chaos.schedule import Schedule

    return Schedule.load(root / "schedule.json")


def _trace(root: Path) -> Any:
    from durable_spaces.chaos.schedule import read_trace

    return read_trace(root / "trace.txt")


def _trace_hits(root: Path) -> Any:
    from durable_spaces.campaigns.trace_coverage import read_hits

    return read_hits(root / "trace.txt")


def _recipe(root: Path) -> Any:
    from durable_spaces.probe import recipe

    return recipe.load(str(root / "h" / "recipe.toml"))


def _probe_record(root: Path) -> Any:
    from durable_spaces.probe.record import ProbeRecord

    return ProbeRecord.load(root / "runs" / "r1.json")


def _probe_summary(root: Path) -> Any:
    from durable_spaces.probe.report import _meta

    return _meta(root)


def _kept(root: Path) -> Any:
    from durable_spaces.campaigns.checks.kept import load

    return load(root / "run")


def _raw_log(root: Path) -> Any:
    from durable_spaces.campaigns.checks.rawlog import read_log

    return read_log(root / "log.jsonl")


def _manifest_copy(root: Path) -> Any:
    from durable_spaces.campaigns.checks.checkpoint import _read_host

    return _read_host(str(root / "m.manifest"))[0]


def _coordinator(root: Path) -> Any:
    from durable_spaces.drive.coordinator_state import read_state

    return read_state(root)


def _daemon_state(root: Path) -> Any:
    from durable_spaces.backends.spacesd.daemon import LocalDaemon

    return LocalDaemon(root / "sp", Path("/nonexistent")).read_state()


def _daemon_floor(root: Path) -> Any:
    from durable_spaces.backends.spacesd.daemon import LocalDaemon

    return LocalDaemon(root / "sp", Path("/nonexistent")).floor()


def _microvm_state(root: Path) -> Any:
    from durable_spaces.backends.microvm.state import StateFiles

    return StateFiles(root).read("vm")


def _local_record(root: Path) -> Any:
    from durable_spaces.backends.local.disk import read_json

    return read_json(root / "exit.json")


def _local_instance(root: Path) -> Any:
    from durable_spaces.backends.local.backend import LocalBackend

    return LocalBackend(root)._open("sp")


def _local_cgroup_record(root: Path) -> Any:
    from durable_spaces.backends.local.cgroups import RECORD, _recorded

    assert RECORD == ".cgroup-parent"
    return _recorded(root)


def _provided(root: Path) -> Any:
    from durable_spaces.cluster.host import HostAgent

    return HostAgent._load(SimpleNamespace(state_dir=root))  # type: ignore[arg-type]


def _agent_config(root: Path) -> Any:
    from durable_spaces.campaigns.agent import AgentConfigFile

    return AgentConfigFile.load(root)


def _diff_agent_json(root: Path) -> Any:
    from durable_spaces.cli.review_diff import _agent_json

    return _agent_json(root)


def _docker_token(root: Path) -> Any:
    from durable_spaces.backends.docker.backend import DockerBackend

    return DockerBackend(root)._read_token("sp")


SITES: dict[str, Site] = {
    "run-record": Site("runs/run-0001.json", _run_record, refused(DurableSpacesError, "run-0001")),
    "report-scan": Site("runs/run-0001.json", _scan, returns((["run-0000"], ["run-0001.json"]))),
    "schedule": Site("schedule.json", _schedule, refused(BadFileError, "schedule.json")),
    "trace": Site("trace.txt", _trace, refused(BadFileError, "FIFO"), lines=True),
    "trace-hits": Site("trace.txt", _trace_hits, refused(BadFileError, "FIFO"), lines=True),
    "recipe": Site("h/recipe.toml", _recipe, refused(DurableSpacesError, "recipe.toml"), True),
    "probe-record": Site("runs/r1.json", _probe_record, refused(DurableSpacesError, "r1.json")),
    "probe-summary": Site("probe.json", _probe_summary, refused(DurableSpacesError, "probe.json")),
    "check-inputs": Site("run/kept/inputs.json", _kept, refused(DurableSpacesError, "inputs")),
    "check-log": Site("log.jsonl", _raw_log, refused(DurableSpacesError, "log.jsonl")),
    "check-manifest": Site("m.manifest", _manifest_copy, returns(None), lines=True),
    "coordinator-state": Site("coordinator.json", _coordinator, refused(BadFileError)),
    "spacesd-state": Site("sp/state.json", _daemon_state, refused(BadFileError, "state.json")),
    "spacesd-floor": Site("sp/data/exec-epoch", _daemon_floor, refused(DurableSpacesError)),
    "microvm-state": Site("spaces/vm/state.json", _microvm_state, returns(None)),
    "local-record": Site("exit.json", _local_record, returns(None)),
    "local-instance": Site("sp/instance", _local_instance, refused(BadFileError, "instance")),
    "local-cgroup-record": Site(".cgroup-parent", _local_cgroup_record, returns(None)),
    "host-provided": Site("provided.json", _provided, refused(DurableSpacesError, "provided")),
    "agent-config": Site("agent.json", _agent_config, refused(DurableSpacesError, "agent.json")),
    "diff-agent-json": Site("agent.json", _diff_agent_json, returns({})),
    "docker-token": Site("sp/token", _docker_token, refused(BadFileError, "token")),
}


@pytest.mark.parametrize("site", SITES.values(), ids=SITES.keys())
def test_a_fifo_in_the_file_s_place_is_refused_and_never_waited_on(
    site: Site, tmp_path: Path
) -> None:
    bad = fifo(tmp_path / site.path)
    got = on_a_fifo(bad, lambda: site.read(tmp_path))
    assert not got.waited, f"the reader waited for a writer: {got}"
    assert site.check(got.value, got.error), got


DOCUMENTS = {k: s for k, s in SITES.items() if not s.lines}


@pytest.mark.parametrize("site", DOCUMENTS.values(), ids=DOCUMENTS.keys())
def test_a_document_nested_past_any_parser_is_refused_in_one_line(
    site: Site, tmp_path: Path
) -> None:
    bad = tmp_path / site.path
    bad.parent.mkdir(parents=True, exist_ok=True)
    # A line of its own, then one more: a log reads a bad last line as torn, not damage.
    bad.write_bytes(deep_toml() if site.toml else deep_json() + b"\n{}\n")
    try:
        value, error = site.read(tmp_path), None
    except Exception as e:  # RecursionError included: the check says it is wrong
        value, error = None, e
    assert not isinstance(error, RecursionError)
    assert site.check(value, error), (value, error)


def test_a_manifest_nested_too_deep_is_not_a_manifest() -> None:
    """The adapter's reader and the checker's each (the checker reads manifests raw)."""
    from durable_spaces.adapter.checkpoints.manifest import ManifestError, decode
    from durable_spaces.campaigns.checks.checkpoint import _entries

    with pytest.raises(ManifestError, match="nested deeper"):
        decode(deep_json())
    with pytest.raises(BadFileError, match="a manifest: JSON nested deeper"):
        _entries(deep_json())


def test_a_log_commit_nested_past_the_parser_is_a_damaged_log(tmp_path: Path) -> None:
    """The product's own reader of a JSONL log: a line before the last that no parser can
    read is damage (``CorruptLogError``), not a ``RecursionError`` out of the open."""
    from durable_spaces.errors import CorruptLogError
    from durable_spaces.harness.log import JsonlStorage

    log = tmp_path / "log.jsonl"
    good = json.dumps({"seq": 2, "epoch": None, "ops": []}).encode()
    log.write_bytes(b'{"seq": 1, "epoch": null, "ops": [' + deep_json() + b"]}\n" + good + b"\n")
    with pytest.raises(CorruptLogError, match="line 1"):
        JsonlStorage(log).load()


# --- the command line ------------------------------------------------------------------


def _campaign(root: Path) -> Path:
    d = root / "c"
    RunRecord("run-0000", "s-0", "transactional", "local", 2).save(d / "runs")
    return d


def _one_line_error(args: list[str], code: int = 2) -> str:
    r = runner.invoke(cli.app, args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == code, (r.exit_code, r.output)
    assert "Traceback" not in r.output and not isinstance(r.exception, RecursionError)
    assert len(lines) == 1 and lines[0].startswith("durable-spaces: error: "), r.stderr
    return lines[0]


def test_report_skips_a_deep_record_and_a_fifo_with_a_warning_each(tmp_path: Path) -> None:
    d = _campaign(tmp_path)
    (d / "runs" / "run-0001.json").write_bytes(deep_json())
    fifo(d / "runs" / "run-0002.json")
    got = on_a_fifo(
        d / "runs" / "run-0002.json", lambda: runner.invoke(cli.app, ["report", str(d)])
    )
    assert not got.waited and got.error is None
    r = got.value
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("durable-spaces: warning:")]
    assert warnings == [
        f"durable-spaces: warning: skipped {d / 'runs' / 'run-0001.json'}: "
        "JSON nested deeper than 64",
        f"durable-spaces: warning: skipped {d / 'runs' / 'run-0002.json'}: "
        "is a FIFO, not a regular file",
        "durable-spaces: warning: skipped 2 of 3 run records",
    ]
    assert (d / "report.md").exists()


def test_report_compare_warns_of_the_records_it_leaves_out(tmp_path: Path) -> None:
    """It dropped them silently: the table's figures were of fewer runs than were made."""
    a = _campaign(tmp_path / "a")
    b = _campaign(tmp_path / "b")
    (b / "runs" / "run-0001.json").write_bytes(deep_json())
    fifo(b / "runs" / "run-0002.json")
    got = on_a_fifo(
        b / "runs" / "run-0002.json",
        lambda: runner.invoke(cli.app, ["report", "--compare", str(a), str(b)]),
    )
    assert not got.waited and got.error is None
    r = got.value
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("durable-spaces: warning:")]
    assert len(warnings) == 3 and "run-0001.json: JSON nested deeper" in warnings[0]
    assert "run-0002.json: is a FIFO" in warnings[1]
    assert warnings[2] == "durable-spaces: warning: skipped 2 run records"
    assert "| runs | 1.0 | 1.0 | 0.0 |" in r.stdout  # B's run-0000 alone


@pytest.mark.parametrize("what", ["deep", "fifo"])
def test_repro_exact_of_a_bad_record_is_one_line(what: str, tmp_path: Path) -> None:
    bad = tmp_path / "run-0001.json"
    if what == "deep":
        bad.write_bytes(deep_json())
        line = _one_line_error(["repro", "--exact", str(bad)])
        assert "nested deeper than 64" in line
        return
    fifo(bad)
    got = on_a_fifo(bad, lambda: _one_line_error(["repro", "--exact", str(bad)]))
    assert not got.waited and got.error is None, got
    assert "is not a run record file" in got.value


@pytest.mark.parametrize("what", ["deep", "fifo", "fifo-in-dir"])
def test_probe_of_a_bad_recipe_is_one_line(what: str, tmp_path: Path) -> None:
    bad = tmp_path / "h" / "recipe.toml"
    given = bad if what != "fifo-in-dir" else bad.parent
    if what == "deep":
        bad.parent.mkdir()
        bad.write_bytes(deep_toml())
        line = _one_line_error(["probe", "--harness", str(given)], code=2)
        assert line.endswith(f"recipe {bad}: TOML nested deeper than 64")
        return
    fifo(bad)
    got = on_a_fifo(bad, lambda: _one_line_error(["probe", "--harness", str(given)], code=2))
    assert not got.waited and got.error is None, got
    assert got.value.endswith(f"recipe {bad} is a FIFO, not a regular file")


def test_check_of_a_kept_run_with_a_fifo_is_one_line(tmp_path: Path) -> None:
    bad = fifo(tmp_path / "run" / "kept" / "inputs.json")
    got = on_a_fifo(bad, lambda: _one_line_error(["check", str(tmp_path / "run")]))
    assert not got.waited and got.error is None, got
    assert "is a FIFO, not a regular file" in got.value


def test_repro_schedule_nested_too_deep_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "s.json"
    bad.write_bytes(deep_json())
    line = _one_line_error(["repro", "--seed", "s-1", "--schedule", str(bad)])
    assert "--schedule" in line and "nested deeper than 64" in line
