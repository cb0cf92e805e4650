"""A power cut under the workspace's state directory (powerfs: what was not synced is
gone), right after a first attempt's first call: the next attempt still finds the call in
the log (adopted, not run again). Every directory the attempt made is durable first
(``integrations/attempt.py``); with ``mkdir -p`` the log went with its directory's entry,
and the probe's power fault saw the call run twice."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from examples import delete_spaces
from workspaces import append

from durable_spaces.chaos.powerfs import PowerFSError, mount
from durable_spaces.integrations import DurableWorkspace, FrameworkCall, Knowledge

pytestmark = pytest.mark.fuse


def test_a_power_cut_keeps_the_first_attempts_log(tmp_path: Path) -> None:
    backing, mnt, work = tmp_path / "backing", tmp_path / "mnt", tmp_path / "work"
    for d in (backing, mnt, work):
        d.mkdir()
    fs = mount(backing, mnt, state_dir=tmp_path / "powerfs")
    state = mnt / "state" / "workspace"  # two levels the attempt makes
    events: list[str] = []
    call = FrameworkCall("bash", append("a"), "t1", "c1", Knowledge(frozenset()))
    try:
        first = DurableWorkspace(state, workspace=work)
        first.run_sync(call)
        first.close()
        report = fs.cut()
        assert report  # something was dropped: the cut is real
        again = DurableWorkspace(state, workspace=work, on_recovery=lambda e: events.append(e.kind))
        again.run_sync(call)
        again.close()
        assert (work / "log.txt").read_text().split() == ["a"]
        assert events == ["adopted"]
    finally:
        with contextlib.suppress(Exception):
            delete_spaces(state / "spaces")
        with contextlib.suppress(PowerFSError):
            fs.unmount(sync=False)
