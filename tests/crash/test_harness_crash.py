"""Crash tests of the harness with real processes: SIGKILL a driver at named failpoints and
at random times, reopen the same SQLite/JSONL log in a new process, resume, and check.

What must hold after every kill: the log reopens (never corrupt); the resumed run finishes;
the input was admitted once; every tool call has exactly one result; a non-replay-safe call
ends ``interrupted`` exactly when the kill left it ``running``, and a replay-safe one runs
again to completion; committed effects happened once (journal tokens are unique).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_spaces.errors import StorageLockedError
from durable_spaces.harness.log import open_storage
from durable_spaces.harness.scheduler import Entry, Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.testing import implied_workspace

CHILD = Path(__file__).with_name("harness_child.py")
STEPS = 5
SLEEP = 0.15  # the scripted bash commands sleep this long: a window to be killed in
SEED = "crash-19"  # write, bash, edit, bash, edit (checked in test_seed_mixes_tools)


@dataclass
class Snapshot:
    """What the log says, read in this (separate) process."""

    entries: list[Entry]
    tasks: list[dict[str, Any]]
    submissions: int
    settled: str | None


def _open_after_kill(url: str) -> Any:
    """The log, opened as soon as its killed owner's lock is gone.

    A child the killed driver forked holds the lock's open file description until it
    execs (close-on-exec), a window of microseconds that a loaded machine stretches past
    the parent's death; a lock still held after a few seconds is a real leak and fails."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            return open_storage(url)  # raises if the log were corrupt or still owned
        except StorageLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _snapshot(url: str) -> Snapshot:
    async def read() -> Snapshot:
        storage = _open_after_kill(url)
        try:
            h = await Harness.open(storage, models={}, registry=Registry().install(CodingTools))
            convs = h.conversations()
            entries = convs[0].entries() if convs else []
            subs = convs[0].submissions() if convs else []
            settled = subs[0].status if subs else None
            return Snapshot(entries, h.tasks(), len(subs), settled)
        finally:
            storage.close()

    return asyncio.run(read())


def _child(
    url: str, ws: Path, *, failpoint: str = "", safe: bool = False, seed: str = SEED
) -> subprocess.Popen[str]:
    env = {**os.environ, "DS_FAILPOINTS": failpoint, "DO_NOT_TRACK": "1", "CUA_TELEMETRY": "0"}
    argv = [sys.executable, str(CHILD), url, str(ws), seed, str(STEPS), "job-1"]
    argv += ["--sleep", str(SLEEP)] + (["--safe-bash"] if safe else [])
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(url: str, ws: Path, safe: bool) -> dict[str, Any]:
    proc = _child(url, ws, safe=safe)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return dict(json.loads(out.strip().splitlines()[-1]))


def _check(cut: Snapshot, final: Snapshot, ws: Path, safe: bool) -> None:
    running = {t["call_id"] for t in cut.tasks if t["kind"] == "tool" and t["state"] == "running"}
    assert cut.submissions <= 1 and final.submissions == 1  # admitted once
    assert final.settled == "done"
    assert [e.kind for e in final.entries].count("user") == 1
    assert final.entries[-1].kind == "assistant" and final.entries[-1].data["content"] == "done"
    assert all(t["state"] == "done" for t in final.tasks)
    results = [e for e in final.entries if e.kind == "tool_result"]
    assert len(results) == STEPS and len({r.data["call_id"] for r in results}) == STEPS
    # The cut log is a prefix of the final one: nothing committed was lost or rewritten.
    assert [e.data for e in final.entries[: len(cut.entries)]] == [e.data for e in cut.entries]
    by_call = {r.data["call_id"]: r for r in results}
    tasks = {t["call_id"]: t for t in final.tasks if t["kind"] == "tool"}
    interrupted = {c for c, r in by_call.items() if r.data["status"] == "interrupted"}
    if safe:
        bash_running = {c for c in running if tasks[c]["name"] == "bash"}
        assert interrupted == running - bash_running
        for c in bash_running:  # replayed to completion, as attempt 2
            assert by_call[c].data["status"] == "ok" and tasks[c]["attempt"] == 2
    else:
        assert interrupted == running
    calls = {
        tc["id"]: tc for e in final.entries if e.kind == "assistant" for tc in e.data["tool_calls"]
    }
    tainted = {calls[c]["args"].get("path") for c in interrupted} - {None}
    errors = [r for r in results if r.data["status"] == "error"]
    # An error can only follow a cut-off write/edit whose effect the model did not see.
    assert all(calls[r.data["call_id"]]["args"].get("path") in tainted for r in errors)
    implied = implied_workspace(final.entries)
    for path, content in implied.items():
        if path not in tainted and path != "journal.txt":
            assert (ws / path).read_text() == content, path
    time.sleep(SLEEP + 0.1)  # let an orphaned command of the killed driver land
    journal = (ws / "journal.txt").read_text().splitlines() if (ws / "journal.txt").exists() else []
    rerun = {  # tokens of bash calls that were legitimately run twice (replay-safe)
        c["args"]["command"].rsplit("'", 2)[-2]
        for cid, c in calls.items()
        if c["name"] == "bash" and tasks[cid]["attempt"] > 1
    }
    for line in implied.get("journal.txt", "").splitlines():
        assert journal.count(line) == 1 or (line in rerun and journal.count(line) == 2), line
    assert all(journal.count(line) == 1 for line in journal if line not in rerun)
    if not safe:
        assert not rerun


def _kill_and_resume(
    tmp: Path, kind: str, *, failpoint: str = "", delay: float | None = None, safe: bool = False
) -> tuple[Snapshot, Snapshot]:
    ws = tmp / "ws"
    ws.mkdir()
    url = f"{kind}:{tmp / ('log.db' if kind == 'sqlite' else 'log.jsonl')}"
    if delay is not None:
        # A driver done before the kill would have tested nothing: it stops itself once
        # its run settled (before it closes the log), so the kill always finds it, cut
        # mid-run or at the very end.
        failpoint = "child.settled:1:stop"
    proc = _child(url, ws, failpoint=failpoint, safe=safe)
    if delay is not None:
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    if delay is not None:
        assert proc.returncode == -signal.SIGKILL, f"the kill at {delay:.2f} s found no driver"
    elif failpoint:
        assert proc.returncode == -signal.SIGKILL, f"{failpoint} was never hit"
    cut = _snapshot(url)
    _finish(url, ws, safe)
    final = _snapshot(url)
    _check(cut, final, ws, safe)
    _finish(url, ws, safe)  # a third driver finds nothing to do and admits nothing
    again = _snapshot(url)
    assert [e.id for e in again.entries] == [e.id for e in final.entries]
    return cut, final


def test_seed_mixes_tools(tmp_path: Path) -> None:
    _, final = _kill_and_resume(tmp_path, "sqlite")
    names = [e.data["name"] for e in final.entries if e.kind == "tool_result"]
    assert {"write", "edit", "bash"} <= set(names), names


FAILPOINTS = [
    "harness.admit:1",  # input admitted, nothing else
    "harness.intent:1",  # tool intent committed, execute never started
    "harness.tool_running:1",  # running committed, execute not yet called
    "harness.tool_running:3",
    "child.mid_bash:1",  # a shell command in flight
    "harness.output:1",  # some live output committed
    "harness.tool_returned:2",  # execute returned, result not committed
    "harness.tool_result:2",  # result committed
    "harness.generated:3",  # model answered, answer not committed
]


@pytest.mark.parametrize("failpoint", FAILPOINTS)
@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_kill_at_failpoint(tmp_path: Path, kind: str, failpoint: str) -> None:
    cut, final = _kill_and_resume(tmp_path, kind, failpoint=failpoint)
    running = [t for t in cut.tasks if t["kind"] == "tool" and t["state"] == "running"]
    name = failpoint.split(":")[0]
    cut_off = name in ("harness.tool_running", "child.mid_bash", "harness.output")
    assert bool(running) == (cut_off or name == "harness.tool_returned")
    if name == "harness.output":  # the interrupted result carries the committed output
        [r] = [e for e in final.entries if e.data.get("status") == "interrupted"]
        assert r.data["output"].startswith("$ sleep") and r.data["output"] in r.data["content"]


@pytest.mark.parametrize("failpoint", ["child.mid_bash:1", "harness.tool_returned:2"])
def test_replay_safe_tool_runs_again(tmp_path: Path, failpoint: str) -> None:
    cut, final = _kill_and_resume(tmp_path, "sqlite", failpoint=failpoint, safe=True)
    [task] = [t for t in cut.tasks if t["kind"] == "tool" and t["state"] == "running"]
    [after] = [t for t in final.tasks if t["id"] == task["id"]]
    assert (after["attempt"], after["status"]) == (2, "ok")


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(delay=st.floats(0.2, 1.6), kind=st.sampled_from(["sqlite", "jsonl"]), safe=st.booleans())
def test_kill_at_random_time(
    tmp_path_factory: pytest.TempPathFactory, delay: float, kind: str, safe: bool
) -> None:
    _kill_and_resume(tmp_path_factory.mktemp("rnd"), kind, delay=delay, safe=safe)
