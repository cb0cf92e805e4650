"""Crash tests: real driver processes SIGKILLed at each step of a call.

Each test drives a scripted session (writes, edits, appending shell commands) through
``run_durable_session`` in child processes; the first attempt dies at a failpoint, later
attempts resume with a higher epoch. The campaign checker then compares the workspace
with what the committed log implies (exactly once, in order, no error results, no stale
writes, transactional image equal to the workspace).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from drive import Attempt, drive, setup
from needs import need

from durable_spaces.backends import open_backend

STEPS = [
    "adapter.call:2",
    "adapter.start_mark:2",
    "adapter.spawn:1",
    "adapter.running:1",
    "adapter.exit:1",
    "adapter.file_op:2",
    "adapter.outcome_commit:2",
    "adapter.checkpoint:2",
    "harness.tool_returned:3",
    "harness.tool_result:2",
]

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("spacesd", marks=pytest.mark.spacesd, id="spacesd"),
]


def _need(backend: str) -> None:
    need(backend)


def _assert_consistent(o) -> None:  # type: ignore[no-untyped-def]
    bad = {k: v for k, v in o.verdicts.items() if v.get("valid") is not True}
    assert not bad, f"codes={o.codes} events={o.kinds()} bad={bad} stderr={o.stderr[-1]}"
    assert o.codes[-1] == 0, o.stderr


# Transactional mode takes no checkpoints, so its calls have no checkpoint steps.
MODE_STEPS = [
    pytest.param(mode, step, id=f"{mode}-{step}")
    for mode in ("transactional", "checkpoint")
    for step in STEPS
    if not (mode == "transactional" and "checkpoint" in step)
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("mode", "step"), MODE_STEPS)
def test_kill_at_each_step_then_kill_in_recovery(
    tmp_path: Path, backend: str, mode: str, step: str
) -> None:
    _need(backend)
    setup(tmp_path, backend, mode)
    o = drive(
        tmp_path,
        [Attempt(step), Attempt("recovery.start:1"), Attempt()],
        backend=backend,
    )
    _assert_consistent(o)
    assert -9 in o.codes  # the failpoint really killed a driver


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_epoch_restart_reattaches_to_running_command(tmp_path: Path, backend: str) -> None:
    _need(backend)
    # The first command holds on the gate: still running when its driver is killed and
    # when the restarted one reaches it; the gate opens once that one is attached to it.
    setup(tmp_path, backend, "transactional", gate=True, sleep=0.0, seed="1", calls=3)
    # A driver restarted without an epoch bump (e.g. by a supervisor) finds its command
    # still running under the same epoch: it must wait for it, not run it again.
    o = drive(
        tmp_path,
        [Attempt("adapter.running:1", epoch=1), Attempt(epoch=1, release="adapter.spawn 1")],
        backend=backend,
    )
    _assert_consistent(o)
    assert "reattached" in o.kinds()


@pytest.mark.parametrize("backend", BACKENDS)
def test_command_exited_is_replayed_not_rerun(tmp_path: Path, backend: str) -> None:
    _need(backend)
    setup(tmp_path, backend, "checkpoint", sleep=0.0, seed="1", calls=3)
    o = drive(tmp_path, [Attempt("adapter.exit:1"), Attempt()], backend=backend)
    _assert_consistent(o)
    assert "replayed" in o.kinds()


def _cut_off() -> list[Attempt]:
    """The first command holds on the gate until the newer driver has raised the Space's
    epoch (which kills it) and found the call's record: surely cut off, whatever the load."""
    return [Attempt("adapter.running:1"), Attempt(release="recovery.start 1")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_command_cut_off_by_new_epoch_checkpoint_restores_and_interrupts(
    tmp_path: Path, backend: str
) -> None:
    _need(backend)
    setup(tmp_path, backend, "checkpoint", gate=True, sleep=0.0, seed="1", calls=2)
    o = drive(tmp_path, _cut_off(), backend=backend)
    _assert_consistent(o)
    kinds = o.kinds()
    assert "restored" in kinds and "interrupted" in kinds, kinds


@pytest.mark.parametrize("backend", BACKENDS)
def test_command_cut_off_by_new_epoch_transactional_reverts_and_reruns(
    tmp_path: Path, backend: str
) -> None:
    _need(backend)
    setup(tmp_path, backend, "transactional", gate=True, sleep=0.0, seed="1", calls=2)
    o = drive(tmp_path, _cut_off(), backend=backend)
    _assert_consistent(o)
    kinds = o.kinds()
    assert "reverted" in kinds and "ran" in kinds, kinds


def _remove_space(backend: str):  # type: ignore[no-untyped-def]
    async def remove(tmp: Path) -> None:
        b = open_backend(backend, tmp / "spaces")
        for name in await b.names():
            await b.delete(name)
        await b.close()

    return remove


@pytest.mark.parametrize("backend", BACKENDS)
def test_lost_space_is_reimaged_from_the_log(tmp_path: Path, backend: str) -> None:
    _need(backend)
    setup(tmp_path, backend, "transactional", calls=6)
    o = drive(
        tmp_path,
        [Attempt("harness.tool_result:3"), Attempt(before=_remove_space(backend))],
        backend=backend,
    )
    _assert_consistent(o)
    assert "reimaged" in o.kinds()


@pytest.mark.parametrize("backend", BACKENDS)
def test_lost_space_is_restored_from_the_store(tmp_path: Path, backend: str) -> None:
    _need(backend)
    setup(tmp_path, backend, "checkpoint", calls=6)
    o = drive(
        tmp_path,
        [Attempt("adapter.outcome_commit:3"), Attempt(before=_remove_space(backend))],
        backend=backend,
    )
    _assert_consistent(o)
    assert "restored" in o.kinds()


def test_lost_space_without_store_fails_permanently_with_advice(tmp_path: Path) -> None:
    setup(tmp_path, "local", "checkpoint", calls=6, store=False)
    o = drive(tmp_path, [Attempt("harness.tool_result:3"), Attempt(before=_remove_space("local"))])
    assert o.codes[-1] == 78
    assert "CheckpointStore or mode transactional" in o.stderr[-1]


def test_auto_switches_to_checkpoint_when_limits_are_crossed(tmp_path: Path) -> None:
    setup(tmp_path, "local", "auto", calls=8, max_files=2)
    o = drive(tmp_path, [Attempt("adapter.checkpoint:1"), Attempt()])
    _assert_consistent(o)
    assert "mode" in o.kinds()


def test_state_dir_is_left_behind_for_review(tmp_path: Path) -> None:
    setup(tmp_path, "local", "transactional", calls=2)
    o = drive(tmp_path, [Attempt()])
    _assert_consistent(o)
    assert (tmp_path / "state" / "log.sqlite").exists()
    shutil.rmtree(tmp_path / "spaces", ignore_errors=True)
