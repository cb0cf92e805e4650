"""The checker's raw inputs: the log read with sqlite3/json (torn JSONL tails), the
workspace walked or parsed from a tar with everything visible, nothing of the adapter's
storage or scanner on the way; kept runs re-checked offline by ``durable-spaces check``;
run records keep the anomalies."""

from __future__ import annotations

import io
import os
import socket
import stat
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from checker_scenes import dump, scene, scripted
from typer.testing import CliRunner

from durable_spaces import cli
from durable_spaces.campaigns.agent import AgentConfigFile
from durable_spaces.campaigns.checker import check_all, merge
from durable_spaces.campaigns.checks import kept
from durable_spaces.campaigns.checks.inputs import Workload
from durable_spaces.campaigns.checks.rawlog import read_log
from durable_spaces.campaigns.checks.workspace import parse_tar, to_tar, walk_host
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.errors import ConfigError, CorruptLogError
from durable_spaces.harness.log import JsonlStorage, open_fenced_sqlite

# --- the log -----------------------------------------------------------------------------


def test_sqlite_read_raw_while_a_fenced_writer_is_open(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    storage, _ = open_fenced_sqlite(path, epoch=3)
    storage.append([{"op": "a"}])
    storage.append([{"op": "b", "n": [1, 2]}])
    log = read_log(path)
    assert [(c.seq, c.epoch, c.ops) for c in log.commits] == [
        (1, 3, [{"op": "a"}]), (2, 3, [{"op": "b", "n": [1, 2]}]),
    ]  # fmt: skip
    assert log.format == "sqlite" and log.floor == 3 and log.written_ns is not None
    storage.append([{"op": "c"}])  # the reader took nothing a writer needs
    assert len(read_log(path).commits) == 3
    storage.close()


def test_jsonl_torn_last_line_is_tolerated_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    with JsonlStorage(path) as s:
        s.append([{"op": "a"}])
        s.append([{"op": "b"}])
    torn = b'{"seq":3,"epoch":null,"ops":[{"op"'
    with open(path, "ab") as f:  # a crash in the middle of the third append
        f.write(torn)
    log = read_log(path)
    assert [c.seq for c in log.commits] == [1, 2]
    assert log.torn_tail == f"line 4: {len(torn)} bytes without a newline"  # 1: identity
    assert log.format == "jsonl"


def test_jsonl_damage_before_the_last_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(
        b'{"seq":1,"epoch":null,"ops":[]}\nnot json\n{"seq":3,"epoch":null,"ops":[]}\n'
    )
    with pytest.raises(CorruptLogError, match="line 2"):
        read_log(path)


def test_a_torn_jsonl_tail_shows_in_log_intact(tmp_path: Path) -> None:
    s = scene(tmp_path)
    s.t.close()
    jsonl = tmp_path / "log.jsonl"
    with JsonlStorage(jsonl) as j:
        for c in read_log(s.log).commits:
            j.append(c.ops)
    with open(jsonl, "ab") as f:
        f.write(b'{"seq":99')
    s.log = jsonl
    v = s.verdicts()
    assert v["log_intact"]["valid"] is True and "torn last line" in v["log_intact"]["detail"]
    assert v["workspace_equals_log"]["valid"] is True


def test_the_checker_imports_none_of_the_adapters_storage_or_scanner() -> None:
    adapter = ["adapter.log", "adapter.image", "backends.local_fs", "adapter.durable"]
    code = (
        "import sys, durable_spaces.campaigns.checker, durable_spaces.campaigns.checks.kept\n"
        f"print([m for m in {adapter!r} if 'durable_spaces.' + m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# --- the workspace -----------------------------------------------------------------------


def _tree(root: Path) -> None:
    root.mkdir()
    (root / "a.txt").write_bytes(b"\x00bytes\xff\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o4755)
    (root / "empty").mkdir()
    (root / "sub").mkdir()
    (root / "sub" / "b").write_text("b\n")
    (root / "link").symlink_to("../outside/nowhere")
    (root / "etc").symlink_to("/etc")  # never followed
    os.mkfifo(root / "pipe")
    (root / ".ds-tmp-abcdef012345").write_text("half")


def test_the_walk_sees_everything_and_follows_no_symlink(tmp_path: Path) -> None:
    root = tmp_path / "w"
    _tree(root)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "sock"))
        ws = walk_host(str(root))
    kinds = {p: n.kind for p, n in ws.nodes.items()}
    assert kinds == {
        ".": "dir", "a.txt": "file", "run.sh": "file", "empty": "dir", "sub": "dir",
        "sub/b": "file", "link": "symlink", "etc": "symlink", "pipe": "fifo", "sock": "socket",
        ".ds-tmp-abcdef012345": "file",
    }  # fmt: skip
    assert ws.nodes["a.txt"].data == b"\x00bytes\xff\n"
    assert ws.nodes["run.sh"].mode == 0o4755
    assert ws.nodes["link"].target == "../outside/nowhere"
    assert all(n.ctime_ns and n.mtime_ns for n in ws.nodes.values())


def test_a_system_tar_parses_to_the_walk_and_kept_tars_keep_nanoseconds(tmp_path: Path) -> None:
    root = tmp_path / "w"
    _tree(root)
    if os.geteuid() == 0:
        os.mknod(root / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    walked = walk_host(str(root))
    data = subprocess.run(
        ["tar", "-cf", "-", "--numeric-owner", "--format=posix", "-C", str(root), "."],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    parsed = parse_tar(data)
    assert parsed.fine_times
    assert parsed.nodes == walked.nodes  # bytes, modes, targets, kinds, devices, ns times
    again, rest = to_tar(walked)
    assert rest == {}
    assert parse_tar(again).nodes == walked.nodes
    with tarfile.open(fileobj=io.BytesIO(again)) as t:  # an ordinary tar for humans
        assert "./sub/b" in t.getnames()


# --- kept runs and the offline check ------------------------------------------------------


def _kept_run(tmp_path: Path) -> Path:
    s = scripted(tmp_path / "run", "ck-keep", 6)
    s.t.close()
    kept.keep(tmp_path / "run", s.inputs())
    return tmp_path / "run"


def test_a_kept_run_rechecks_offline_with_the_same_verdicts(tmp_path: Path) -> None:
    s = scripted(tmp_path / "run", "ck-keep", 6)
    s.t.close()
    live = check_all(s.inputs())
    assert merge(live) is True, dump(live)
    kept.keep(tmp_path / "run", s.inputs())
    assert check_all(kept.load(tmp_path / "run")) == live
    r = CliRunner().invoke(cli.app, ["check", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().splitlines()[-1].endswith("valid=True failing=-")


def test_the_offline_check_fails_a_tampered_kept_workspace(tmp_path: Path) -> None:
    run = _kept_run(tmp_path)
    tar_path = run / "kept" / "workspace.tar"
    ws = parse_tar(tar_path.read_bytes())
    path, n = next((p, n) for p, n in sorted(ws.nodes.items()) if n.kind == "file")
    line = (n.data or b"").splitlines(keepends=True)[0]
    doubled = line + (n.data or b"")  # its first line applied twice
    ws.nodes[path] = replace(n, data=doubled, size=len(doubled))
    tar_path.write_bytes(to_tar(ws)[0])
    r = CliRunner().invoke(cli.app, ["check", str(run)])
    assert r.exit_code == 1, r.output
    assert "exactly_once" in r.stdout.strip().splitlines()[-1]
    inputs = kept.load(run)
    dup = check_all(inputs)["exactly_once"]["anomalies"]
    caller = inputs.implied.origin[line.decode().rstrip("\n")]
    assert [(a["name"], a["path"], a["witness"]) for a in dup] == [
        ("duplicate_effect", path, [caller])
    ], dump(dup)


def test_check_on_a_directory_without_a_kept_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--keep"):
        kept.load(tmp_path)
    r = CliRunner().invoke(cli.app, ["check", str(tmp_path)])
    assert r.exit_code == 2 and "--keep" in r.output


# --- run records --------------------------------------------------------------------------


def test_run_records_keep_anomalies_and_read_old_records() -> None:
    a = {"name": "lost_effect", "path": "f0.txt", "witness": ["call-1", 7], "detail": "gone"}
    check = {"valid": False, "detail": "x", "anomalies": [a]}
    rec = RunRecord("run-0", "s", "transactional", "local", 2, checks={"exactly_once": check})
    back = RunRecord.from_json(rec.to_json())
    assert back.checks["exactly_once"].get("anomalies") == [a]
    old = RunRecord.from_json({**rec.to_json(), "checks": {"x": {"valid": True, "detail": ""}}})
    assert old.checks["x"] == {"valid": True, "detail": ""} and old.valid is True


def test_a_gate_read_back_from_a_kept_run_or_agent_json_is_checked(tmp_path: Path) -> None:
    w = Workload("s", 2, gate="/tmp/the gate")
    assert Workload.from_json(w.to_json()) == w
    assert Workload.from_json({"seed": "s", "calls": 2}).gate is None  # older records
    for bad in ("gate", "/tmp/it's"):
        with pytest.raises(ValueError, match="gate"):
            Workload.from_json({**w.to_json(), "gate": bad})
        AgentConfigFile("local", str(tmp_path / "spaces"), "auto", "s", 2, gate=bad).save(tmp_path)
        with pytest.raises(ConfigError, match=r"agent\.json is malformed: gate"):
            AgentConfigFile.load(tmp_path)
