"""A framework's calls through ``DurableWorkspace`` (integrations/threads.py), as any
framework makes them: by the call's id, on a thread, saying which calls its own state
holds; each attempt a new workspace object (a new process's epoch) on the same state
directory. Real local Spaces, real commands, the real SQLite log."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from workspaces import append, attempts, conversations

from durable_spaces.adapter.durable import DurableSpaces
from durable_spaces.errors import StaleEpochError


def test_calls_a_framework_runs_again_from_its_start_are_adopted_from_the_log(
    tmp_path: Path,
) -> None:
    """DBOS runs a recovered workflow's tools again from its first: each finds its result
    in the log, even the ones the adapter's own record of the last calls no longer holds
    (``space_state.KEEP_CALLS``), and nothing runs twice."""
    with attempts(tmp_path) as a:
        a.attempt()
        held = [[f"c{j}" for j in range(k)] for k in range(6)]
        first = [a.call("bash", append(f"w{k}"), f"c{k}", held[k]) for k in range(6)]
        a.attempt()
        again = [a.call("bash", append(f"w{k}"), f"c{k}", held[k]) for k in range(6)]
        assert a.log() == [f"w{k}" for k in range(6)]
        assert [r.content for r in again] == [r.content for r in first]
        assert a.kinds().count("adopted") == 6


@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
def test_calls_the_framework_does_not_hold_are_taken_out_of_the_space(
    tmp_path: Path, mode: str
) -> None:
    """The framework resumed from a checkpoint that holds c1 only (c2 and c3 ran after
    it): before its next call, the Space goes back to right before c2, and the log keeps
    c2 and c3 in the conversation the thread leaves (a fork goes on)."""
    with attempts(tmp_path, mode) as a:  # type: ignore[arg-type]
        a.attempt()
        a.call("bash", append("a"), "c1")
        a.call("bash", append("b"), "c2", ["c1"])
        a.call("write", {"path": "x.txt", "content": "x\n"}, "c3", ["c1", "c2"])
        a.attempt()
        a.call("bash", append("d"), "c4", ["c1"])
        assert a.log() == ["a", "d"]
        assert not (a.work / "x.txt").exists()
        assert "log_behind" in a.kinds()
        assert ("reverted" if mode == "transactional" else "restored") in a.kinds()
        convs = conversations(a.state)
        assert [(c[1], c[2]) for c in convs] == [
            (None, {"thread": "t1"}),
            (convs[0][0], {"thread": "t1"}),
        ]


def test_files_there_before_a_forgotten_call_stay(tmp_path: Path) -> None:
    """Forgotten calls are undone, not the workspace: a file the user had before the first
    call, and one made by hand between a held call and a forgotten one, are still there
    (transactional mode: the forgotten call's start mark committed them)."""
    with attempts(tmp_path, "transactional") as a:
        (a.work / "thesis.txt").write_text("mine\n")
        a.attempt()
        a.call("bash", append("a"), "c1")
        (a.work / "notes.txt").write_text("by hand\n")
        a.call("bash", append("b"), "c2", ["c1"])
        a.attempt()
        a.call("bash", append("c"), "c3", ["c1"])
        assert a.log() == ["a", "c"]
        assert (a.work / "thesis.txt").read_text() == "mine\n"
        assert (a.work / "notes.txt").read_text() == "by hand\n"


def test_the_first_call_forgotten_leaves_the_files_from_before_it(tmp_path: Path) -> None:
    with attempts(tmp_path) as a:
        (a.work / "thesis.txt").write_text("mine\n")
        a.attempt()
        a.call("bash", append("a"), "c1")
        a.attempt()
        a.call("bash", append("b"), "c2")  # the framework holds nothing
        assert a.log() == ["b"]
        assert (a.work / "thesis.txt").read_text() == "mine\n"


def test_a_history_trimmed_of_its_old_calls_undoes_nothing(tmp_path: Path) -> None:
    """Only calls after the last one the framework holds can be forgotten ones: a message
    history trimmed of its oldest calls still holds the newest."""
    with attempts(tmp_path) as a:
        a.attempt()
        for k, held in ((1, []), (2, ["c1"]), (3, ["c1", "c2"])):
            a.call("bash", append(f"w{k}"), f"c{k}", held)
        a.attempt()
        a.call("bash", append("w4"), "c4", ["c3"])
        assert a.log() == ["w1", "w2", "w3", "w4"]
        assert "log_behind" not in a.kinds()


def test_a_framework_that_saves_a_turn_after_its_tools_holds_what_this_process_ran(
    tmp_path: Path,
) -> None:
    """The Agents SDK's session saves a turn's calls after they ran: a call this process
    ran is held (``complete=False``); one an earlier process ran that the session never
    saved is forgotten."""
    with attempts(tmp_path) as a:
        a.attempt()
        a.call("bash", append("a"), "c1", complete=False)
        a.call("bash", append("b"), "c2", complete=False)  # c1 in this turn, not saved yet
        assert a.log() == ["a", "b"]
        a.attempt()
        a.call("bash", append("c"), "c3", ["c1"], complete=False)
        assert a.log() == ["a", "c"]


def test_a_fork_a_crash_left_behind_is_brought_back_by_the_next_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between the fork's commit and the Space brought back: the fork's
    ``ds.thread`` says so, and the next attempt brings the Space back before its call."""
    with attempts(tmp_path, "transactional") as a:
        a.attempt()
        a.call("bash", append("a"), "c1")
        a.call("bash", append("b"), "c2", ["c1"])
        a.attempt()
        with monkeypatch.context() as m:

            async def killed(*args: object) -> None:
                raise RuntimeError("killed before the Space was brought back")

            m.setattr(DurableSpaces, "bring_back", killed)
            with pytest.raises(RuntimeError, match="killed before"):
                a.call("bash", append("c"), "c3", ["c1"])
        assert a.log() == ["a", "b"]  # the fork is committed, the Space not brought back
        a.attempt()
        a.call("bash", append("c"), "c3", ["c1"])
        assert a.log() == ["a", "c"]


def test_a_command_finds_its_calls_stable_key(tmp_path: Path) -> None:
    with attempts(tmp_path) as a:
        a.attempt()
        a.call("bash", {"command": 'printf %s "$DS_CALL_KEY" > key.txt'}, "call_x", thread="th")
        assert (a.work / "key.txt").read_text() == "th:call_x"


def test_each_attempt_fences_the_one_before(tmp_path: Path) -> None:
    with attempts(tmp_path) as a:
        old = a.attempt()
        a.call("bash", append("a"), "c1")
        new = a.attempt()
        a.call("bash", append("b"), "c2", ["c1"])
        assert (old.epoch, new.epoch) == (1, 2)
        with pytest.raises(StaleEpochError):
            a.call("bash", append("stale"), "c3", ["c1", "c2"], ws=old)
        assert a.log() == ["a", "b"]


def test_threads_without_a_pinned_workspace_have_a_space_each(tmp_path: Path) -> None:
    """Forgetting a call of one thread leaves the other's Space alone."""
    with attempts(tmp_path, pinned=False) as a:
        a.attempt()
        a.call("bash", {"command": "echo one >> log.txt; pwd"}, "c1", thread="one")
        r = a.call("bash", {"command": "echo two >> log.txt; pwd"}, "c1", thread="two")
        a.attempt()
        a.call("bash", {"command": "cat log.txt"}, "c2", thread="two")  # c1 forgotten
        r1 = a.call("bash", {"command": "cat log.txt"}, "c2", ["c1"], thread="one")
        r2 = a.call("bash", {"command": "cat log.txt"}, "c3", ["c2"], thread="two")
        assert r1.content.startswith("one\n")
        assert "No such file" in r2.content and r.status == "ok"


def test_a_thread_no_environment_can_carry_is_refused_before_anything(tmp_path: Path) -> None:
    with attempts(tmp_path) as a:
        a.attempt()
        r = a.call("bash", append("a"), "c1", thread="t\x00")
        assert r.status == "error" and "cannot be a key" in r.content
        assert a.log() == [] and conversations(a.state) == []


@pytest.mark.parametrize("pinned", [True, False])
def test_a_forks_space_is_its_own_in_every_later_attempt(tmp_path: Path, pinned: bool) -> None:
    """A Space is claimed by one conversation of its log (``adapter/space_owner.py``): the
    thread's fork takes over its parent's claim, so the attempts after the fork use the
    Space (refused as another conversation's without it), and a second state directory's
    log on the same backend never gets the thread's Space."""
    with attempts(tmp_path, pinned=pinned) as a:
        a.attempt()
        a.call("bash", append("a"), "c1")
        a.call("bash", append("b"), "c2", ["c1"])
        a.attempt()
        a.call("bash", append("c"), "c3", ["c1"])  # c2 forgotten: the fork
        a.attempt()
        r = a.call("bash", {"command": "cat log.txt"}, "c4", ["c1", "c3"])
        assert r.status == "ok", r.content
        assert r.content.split()[:2] == ["a", "c"]
        assert len(conversations(a.state)) == 2


def test_what_only_the_space_held_is_kept_when_a_forgotten_call_is_undone(
    tmp_path: Path,
) -> None:
    """Nothing lost: a file made by hand after the forgotten call is no call's and no
    image's; the take-back keeps it in a quarantine checkpoint of the thread's fork
    (``adapter/quarantine.py``), which ``durable-spaces quarantine restore`` gives back
    from the workspace's state directory."""
    with attempts(tmp_path, "transactional") as a:
        a.attempt()
        a.call("bash", append("a"), "c1")
        a.call("bash", append("b"), "c2", ["c1"])
        (a.work / "thesis.txt").write_text("by hand\n")
        a.attempt()
        a.call("bash", append("c"), "c3", ["c1"])
        assert a.log() == ["a", "c"] and not (a.work / "thesis.txt").exists()
        (reverted,) = [e for e in a.events if e.kind == "reverted"]
        named = reverted.detail["quarantine"]
        for ws in a.made:
            ws.close()
        to = tmp_path / "kept"
        s = a.state
        where = ["--backend", "local", "--backend-dir", s / "spaces", "--store", s / "checkpoints"]
        cli = ["durable-spaces", "quarantine", "restore", s, named]
        subprocess.run([*cli, "--to", to, *where], check=True, capture_output=True, timeout=120)
        assert (to / "thesis.txt").read_text() == "by hand\n"
