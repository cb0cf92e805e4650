"""The checker's classes from a workspace and requests made by hand: it can fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_spaces.probe.checker import check, classify, shown_as
from durable_spaces.probe.grade import grade_of, worse
from durable_spaces.probe.recipe import load
from durable_spaces.probe.task import plan
from tests.probe.helpers import write_recipe

N = "0123abcd"


def _requests(shown: str | None) -> list[dict[str, Any]]:
    call = {"id": f"call_{N}_1", "type": "function", "function": {"name": "bash"}}
    msgs: list[dict[str, Any]] = [{"role": "assistant", "tool_calls": [call]}]
    if shown is not None:
        msgs.append({"role": "tool", "tool_call_id": call["id"], "content": shown})
    return [{"step": 1, "answer": "tool", "body": {"messages": []}},
            {"step": 2, "answer": "final", "body": {"messages": msgs}}]  # fmt: skip


@pytest.mark.parametrize(
    ("log", "shown", "cls"),
    [
        ([f"E p{N}s1"], f"O p{N}s1\n", "once"),
        ([f"E p{N}s1", f"E p{N}s1"], f"O p{N}s1\n", "duplicate"),
        ([], None, "lost"),
        ([f"E p{N}s1"], None, "lost"),
        ([], "ok", "phantom"),
        ([], f"O p{N}s1\n", "phantom"),
        ([], "No result provided", "reported"),
        ([f"E p{N}s1"], "interrupted: may or may not have run", "reported"),
        ([f"E p{N}s1 late"], "interrupted", "orphan"),
        ([f"E p{N}s1 late"], f"O p{N}s1\n", "once"),  # reattached: the model saw its output
        ([f"E p{N}s1 late", f"E p{N}s1"], f"O p{N}s1\n", "orphan"),
        ([f"E p{N}s10", f"E p{N}s1x"], "ok", "phantom"),  # another step's line is not this one's
    ],
)  # fmt: skip
def test_each_class(tmp_path: Path, log: list[str], shown: str | None, cls: str) -> None:
    r = load(str(write_recipe(tmp_path / "r", "none")))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "log.txt").write_text("".join(x + "\n" for x in log))
    (res,) = check(plan(1, r, N), tmp_path / "w", _requests(shown), finished=True)
    assert res.cls == cls


def test_an_unfinished_run_leaves_unseen_steps_out(tmp_path: Path) -> None:
    r = load(str(write_recipe(tmp_path / "r", "none")))
    (tmp_path / "w").mkdir()
    assert check(plan(1, r, N), tmp_path / "w", _requests(None), finished=False) == []
    assert classify(2, 0, "none", False) == "duplicate"  # a duplicate counts all the same


def test_shown_and_grades(tmp_path: Path) -> None:
    r = load(str(write_recipe(tmp_path / "r", "none")))
    (step,) = plan(1, r, N)
    cmd = step.command(tmp_path)
    assert shown_as(step, f"$ {cmd}\n") == "fabricated"  # the command echoed is no output
    assert grade_of(["once", "reported"]) == "at-most-once-reported"
    assert grade_of(["once", "duplicate", "reported"]) == "at-least-once"
    assert grade_of(["once", "stuck"]) == "unsafe" and grade_of([]) == "none"
    assert worse("unsafe", "at-least-once") and not worse("exactly-once", "at-least-once")
