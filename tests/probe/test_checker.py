"""The checker's classes from a workspace and requests made by hand: grades from evidence
(the step's output line, the harness's declared report), never from words; what the
model was shown counts only in a request it answered; a step the model asked for twice is
not the harness's duplicate unless the harness ran one call twice."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from durable_spaces.probe.checker import check, classify
from durable_spaces.probe.grade import grade_of, qualified, worse
from durable_spaces.probe.recipe import load
from durable_spaces.probe.task import plan
from tests.probe.helpers import write_recipe

N = "0123abcd"
OUT = f"O p{N}s1\n"
CALL = "call_first"


def _call(cid: str = CALL, k: int = 1) -> dict[str, Any]:
    return {"id": cid, "type": "function",
            "function": {"name": "bash", "arguments": f'{{"command": "p{N} s{k}"}}'}}  # fmt: skip


def _requests(shown: str | None, answered: bool = True) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "assistant", "tool_calls": [_call()]}]
    if shown is not None:
        msgs.append({"role": "tool", "tool_call_id": CALL, "content": shown})
    return [{"n": 0, "step": 1, "call_id": CALL, "answer": "tool", "answered": True,
             "body": {"messages": [{"role": "user", "content": "go"}]}},
            {"n": 1, "step": 2, "answer": "final", "answered": answered,
             "body": {"messages": msgs}}]  # fmt: skip


def _check(tmp_path: Path, log: list[str], requests: list[dict[str, Any]],
           report: str | None = None, finished: bool = True) -> list[Any]:  # fmt: skip
    r = load(str(write_recipe(tmp_path / "r", "none")))
    w = tmp_path / "w"
    w.mkdir(exist_ok=True)
    (w / "log.txt").write_text("".join(x + "\n" for x in log))
    pattern = re.compile(re.escape(report)) if report else None
    return check(plan(1, r, N), w, requests, finished, pattern)


@pytest.mark.parametrize(
    ("log", "shown", "report", "cls"),
    [
        ([f"E p{N}s1 a0"], OUT, None, "once"),
        ([f"E p{N}s1 a0", f"E p{N}s1 a0"], OUT, None, "duplicate"),  # one call run twice
        ([], None, None, "lost"),
        ([f"E p{N}s1 a0"], None, None, "lost"),
        ([], OUT, None, "phantom"),  # its output, and no effect
        # a result without the step's output is no success the probe can believe, and no
        # report it can read: whatever its words say
        ([], "ok", None, "unverified"),
        ([], '{"exit_code": 0, "error": null}', None, "unverified"),
        ([f"E p{N}s1 a0"], '{"exit_code": 0, "error": null}', None, "unverified"),
        ([f"E p{N}s1 a0"], "interrupted: may or may not have run", None, "unverified"),
        # the output, in JSON whose "error" is null: the tool's own result, whatever words
        ([f"E p{N}s1 a0"], f'{{"stdout": "{OUT.strip()}", "error": null}}', None, "once"),
        # the harness's own words for an interruption, declared by its recipe
        ([], "[tool result unavailable: the agent restarted]", "result unavailable", "reported"),
        ([f"E p{N}s1 a0"], "call was cut off", "cut off", "reported"),
        ([], "call was cut off", "outcome unknown", "unverified"),  # other words
        ([f"E p{N}s1 a0 late"], "call was cut off", "cut off", "orphan"),
        ([f"E p{N}s1 a0 late"], OUT, None, "once"),  # reattached: the model saw its output
        ([f"E p{N}s1 a0 late", f"E p{N}s1 a0"], OUT, None, "orphan"),
        ([f"E p{N}s10 a0", f"E p{N}s1x"], "ok", None, "unverified"),  # not this step's lines
    ],
)  # fmt: skip
def test_each_class(tmp_path: Path, log: list[str], shown: str | None, report: str | None,
                    cls: str) -> None:  # fmt: skip
    (res,) = _check(tmp_path, log, _requests(shown), report)
    assert res.cls == cls, res


def test_shown_means_shown_in_a_request_the_model_answered(tmp_path: Path) -> None:
    # step 1's output reached the model only in a request it never answered (the kill
    # held it); the request it did answer said the call was cut off
    reqs = _requests(OUT, answered=False)
    later = {"role": "tool", "tool_call_id": CALL, "content": "call was cut off"}
    reqs.append({"n": 2, "step": 2, "answer": "final", "answered": True,
                 "body": {"messages": [{"role": "assistant", "tool_calls": [_call()]},
                                       later]}})  # fmt: skip
    (res,) = _check(tmp_path, [f"E p{N}s1 a0"], reqs, "cut off")
    assert (res.shown, res.cls) == ("reported", "reported")
    (res,) = _check(tmp_path, [f"E p{N}s1 a0"], reqs[:2], "cut off")  # never answered at all
    assert res.cls == "lost"


def test_a_summary_in_a_user_message_shows_what_it_says(tmp_path: Path) -> None:
    """A harness that resumes with a fresh conversation: one user message summarising
    each call and its result."""
    summary = (f"Calls so far:\n1. bash printf 'O %s%s' p{N} s1 -> {OUT}"
               f"2. bash printf ... p{N} s2 -> interrupted, outcome unknown\n")  # fmt: skip
    reqs = [{"n": 0, "step": 1, "call_id": CALL, "answer": "tool", "answered": True,
             "body": {"messages": [{"role": "user", "content": "go"}]}},
            {"n": 1, "step": 3, "answer": "final", "answered": True,
             "body": {"messages": [{"role": "user", "content": summary}]}}]  # fmt: skip
    (res,) = _check(tmp_path, [f"E p{N}s1 a0"], reqs, "outcome unknown")
    assert res.cls == "once" and res.shown == "output"


def _asked_twice(second_request_shows_step: bool) -> list[dict[str, Any]]:
    first = [{"role": "user", "content": "go"}]
    again = [*first, {"role": "assistant", "tool_calls": [_call()]}]
    if second_request_shows_step:
        again.append({"role": "tool", "tool_call_id": CALL, "content": "outcome unknown"})
    done = [*again, {"role": "assistant", "tool_calls": [_call("call_again")]},
            {"role": "tool", "tool_call_id": "call_again", "content": OUT}]  # fmt: skip
    return [{"n": 0, "step": 1, "call_id": CALL, "answered": True, "body": {"messages": first}},
            {"n": 1, "step": 1, "call_id": "call_again", "answered": True,
             "body": {"messages": again if second_request_shows_step else first}},
            {"n": 2, "step": 2, "answered": True, "body": {"messages": done}}]  # fmt: skip


def test_a_step_the_model_chose_to_ask_again_is_no_duplicate(tmp_path: Path) -> None:
    log = [f"E p{N}s1 a0", f"E p{N}s1 a1"]
    # the model was shown an unverified result and asked again: its own choice
    (res,) = _check(tmp_path, log, _asked_twice(True))
    assert (res.cls, res.asks, res.episodes) == ("unverified", 2, 2)
    # the harness showed nothing of the step and asked again (it lost the call): the
    # second effect is the harness's
    (res,) = _check(tmp_path, log, _asked_twice(False))
    assert (res.cls, res.asks, res.episodes) == ("duplicate", 2, 1)


def test_an_unfinished_run_leaves_unseen_steps_out(tmp_path: Path) -> None:
    assert _check(tmp_path, [], _requests(None), finished=False) == []
    assert classify(2, 0, "none", False, duplicate=True) == "duplicate"


def test_grades() -> None:
    assert grade_of(["once", "reported"]) == "at-most-once-reported"
    assert grade_of(["once", "duplicate", "reported"]) == "at-least-once"
    assert grade_of(["once", "duplicate", "unverified"]) == "unverified"
    assert grade_of(["unverified", "lost"]) == "unsafe"
    assert grade_of(["once", "stuck"]) == "unsafe" and grade_of([]) == "none"
    assert worse("unsafe", "at-least-once") and not worse("exactly-once", "at-least-once")
    assert worse("unverified", "at-least-once") and not worse("unverified", "unverified")
    assert qualified("exactly-once", False) == "partial:exactly-once"
    assert qualified("unsafe", False) == "unsafe" and qualified("at-least-once", True) == (
        "at-least-once"
    )
    assert not worse("partial:at-least-once", "at-least-once")
