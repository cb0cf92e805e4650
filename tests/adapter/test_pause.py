"""A driver paused mid-call and continued after a newer one finished changes nothing.

The interleaving a kill can never produce: driver A stops itself (SIGSTOP, a failpoint's
``pause`` action) with a mutation of the Space issued (``space.mutate``: a write, a step
of a revert) or just before one (a call's file effect, a restore); driver B, one epoch
up, takes over and finishes the session; then A is continued, without its poll of the
log's fence (``no_fence_poll``), so only the Space's fence can stop it. A's pending
mutation must be refused by the Space (A exits 75, fenced), and the workspace must be
exactly as B left it: same paths, same bytes, same inodes and ctimes (a rename of
identical bytes would still show). With the fence removed
(``DS_MUTANTS=unfenced_mutations`` in A only) the same interleaving changes the
workspace, which proves the check can fail.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from needs import need

from durable_spaces.backends import open_backend
from tests.adapter.drive import AGENT, check, cleanup, driver_env, setup

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("spacesd", marks=pytest.mark.spacesd, id="spacesd"),
]

Raw = dict[str, tuple[str, int, int, bytes]]


def raw_workspace(root: str) -> Raw:
    """path -> (kind, inode, ctime_ns, bytes or link target), never following links."""
    out: Raw = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", st.st_ino, st.st_ctime_ns, os.readlink(full).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    out[rel] = ("file", st.st_ino, st.st_ctime_ns, f.read())
            else:
                out[rel] = ("dir" if stat.S_ISDIR(st.st_mode) else "other", st.st_ino, 0, b"")
    return out


async def _space_root(tmp: Path, backend: str) -> str:
    b = open_backend(backend, tmp / "spaces")
    try:
        names = await b.names()
        assert len(names) == 1, names
        space = await b.find(names[0])
        assert space is not None
        return space.root
    finally:
        await b.close()


def _wait_stopped(p: subprocess.Popen[str], timeout: float = 90.0) -> None:
    proc = psutil.Process(p.pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            _, err = p.communicate()
            pytest.fail(f"driver exited {p.returncode} before its pause point:\n{err[-1500:]}")
        if proc.status() == psutil.STATUS_STOPPED:
            return
        time.sleep(0.02)
    p.kill()
    pytest.fail("driver never reached its pause point")


def _run(tmp: Path, epoch: int, failpoints: str = "") -> int:
    env = driver_env(tmp, epoch, failpoints=failpoints)
    return subprocess.run(AGENT, env=env, capture_output=True, timeout=180).returncode


def pause_then_takeover(
    tmp: Path, backend: str, before: list[str], pause: str, *, mutant: bool = False
) -> tuple[int, Raw, Raw]:
    """Drivers ``before`` (failpoints, epochs 1..), then A paused at ``pause``, then B to
    the end, then A continued. Returns A's exit code and the workspace before/after."""
    epoch = 0
    for fp in before:
        epoch += 1
        _run(tmp, epoch, fp)
    env = driver_env(tmp, epoch + 1, failpoints=pause)
    # Without the driver's own 0.2 s poll of the log's fence: the Space's fence alone must
    # stop it (a poll cannot stop an operation already issued, and would hide a mutant).
    env["DS_MUTANTS"] = "unfenced_mutations,no_fence_poll" if mutant else "no_fence_poll"
    a = subprocess.Popen(AGENT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_stopped(a)
        assert _run(tmp, epoch + 2) == 0, "the newer driver did not finish the session"
        root = asyncio.run(_space_root(tmp, backend))
        finished = raw_workspace(root)
        os.kill(a.pid, signal.SIGCONT)
        a.communicate(timeout=120)
        return a.returncode, finished, raw_workspace(root)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()


def _skip(backend: str) -> None:
    need(backend)


CASES = [
    # A stops with its first file mutation issued (the write or edit of a call).
    pytest.param("transactional", [], "space.mutate:1:pause", id="tx-write"),
    pytest.param("checkpoint", [], "space.mutate:1:pause", id="cp-write"),
    # A stops before a call's file effect (before it is issued).
    pytest.param("transactional", [], "adapter.before_file_op:1:pause", id="tx-before"),
    # spacesd: A stops with its write running in the Space, its bytes not yet sent (the
    # advance kills that command; unfenced, it would survive and land).
    pytest.param("transactional", [], "space.mutate_started:1:pause", id="tx-started"),
    # A stops in the middle of a revert: the driver before it died right after a file op.
    pytest.param("transactional", ["adapter.file_op:1"], "space.mutate:1:pause", id="tx-revert"),
    pytest.param("transactional", ["adapter.file_op:1"], "image.apply_op:1:pause", id="tx-apply"),
    # A stops right before a checkpoint restore (same setup, checkpoint mode).
    pytest.param("checkpoint", ["adapter.file_op:1"], "snapshots.restore:1:pause", id="cp-restore"),
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("mode", "before", "pause"), CASES)
def test_paused_driver_changes_nothing_after_takeover(
    tmp_path: Path, backend: str, mode: str, before: list[str], pause: str
) -> None:
    _skip(backend)
    if backend == "local" and pause.startswith("space.mutate_started"):
        pytest.skip("local writes in-process: no command runs between issue and effect")
    setup(tmp_path, backend, mode, calls=5, sleep=0.0)
    try:
        code, finished, after = pause_then_takeover(tmp_path, backend, before, pause)
        assert code == 75, f"the continued driver exited {code}, not 75 (fenced)"
        changed = sorted(p for p in set(finished) | set(after) if finished.get(p) != after.get(p))
        assert not changed, f"the stale driver changed {changed} after the takeover"
        verdicts = asyncio.run(check(tmp_path, backend))
        bad = {k: v for k, v in verdicts.items() if v.get("valid") is not True}
        assert not bad, bad
    finally:
        asyncio.run(cleanup(tmp_path, backend))


MUTANT_CASES = [
    # local's write runs in the driver's worker thread: paused with it issued, it goes on.
    pytest.param("local", "transactional", [], "space.mutate:1:pause", id="local-tx-write"),
    pytest.param(
        "local",
        "transactional",
        ["adapter.file_op:1"],
        "space.mutate:1:pause",
        id="local-tx-revert",
    ),
    # spacesd's write is a command in the Space: paused with it running, the advance kills
    # it when fenced; unfenced (epoch 0) it survives, gets its bytes and lands.
    pytest.param(
        "spacesd",
        "transactional",
        [],
        "space.mutate_started:1:pause",
        marks=pytest.mark.spacesd,
        id="spacesd-tx-write",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "mode", "before", "pause"), MUTANT_CASES)
def test_without_the_fence_the_same_pause_changes_the_workspace(
    tmp_path: Path, backend: str, mode: str, before: list[str], pause: str
) -> None:
    """The mutant that ignores epochs on file operations: the checks above must fail, the
    lab's checker among them (the workspace no longer what the log says)."""
    _skip(backend)
    setup(tmp_path, backend, mode, calls=5, sleep=0.0)
    try:
        _, finished, after = pause_then_takeover(tmp_path, backend, before, pause, mutant=True)
        assert finished != after, "the unfenced stale driver left no trace: the test is blind"
        verdicts = asyncio.run(check(tmp_path, backend))
        flagged = sorted(k for k, v in verdicts.items() if v.get("valid") is False)
        # the stale write is a step applied again, or one lost: the workspace is not the log's
        assert "workspace_equals_log" in flagged, f"the checker passed the stale write: {verdicts}"
    finally:
        asyncio.run(cleanup(tmp_path, backend))
