"""The effect server (durable_spaces/probe/effect_server.py): what it counts, how the
checker grades it, and the probe with ``--effect-server`` on a durable recipe (each effect
once, even when the adapter runs a command again) and on a plain one (a duplicate)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import probe

sys.path.insert(0, str(Path(__file__).parent / "recipes"))
from recipe_trial import load, skip_unless_available

from durable_spaces.probe.checker import check
from durable_spaces.probe.effect_server import EffectServer, count
from durable_spaces.probe.task import Step


@pytest.fixture
def server() -> Iterator[EffectServer]:
    s = EffectServer()
    try:
        yield s
    finally:
        s.close()


def post(server: EffectServer, token: str, *args: str) -> str:
    """One request as a command sends it (curl), with ``args`` (headers, a body)."""
    url = f"{server.url}/effect/{token}"
    argv = ["curl", "-s", "-w", "%{http_code}", "-o", "/dev/null", "-X", "POST", *args, url]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


TOKEN = "p0123abcds1"


def test_a_key_sent_again_is_one_effect_and_unkeyed_requests_count_each(
    server: EffectServer,
) -> None:
    """Idempotency-Key twice: once. Requests written another way (the key under another
    header's name, in the body, or none) are no key to this service: each counts."""
    assert post(server, TOKEN, "-H", "Idempotency-Key: t1:call_1") == "200"
    assert post(server, TOKEN, "-H", "Idempotency-Key: t1:call_1") == "200"
    other = "p0123abcds2"
    post(server, other, "-H", "X-Idempotency-Key: k")
    post(server, other, "-H", "X-Idempotency-Key: k")
    third = "p0123abcds3"
    post(server, third, "-H", "Content-Type: application/json", "-d", '{"key": "k"}')
    post(server, third, "-H", "Content-Type: application/json", "-d", '{"key": "k"}')
    post(server, third)
    assert server.counts() == {TOKEN: 1, other: 2, third: 3}
    assert post(server, TOKEN, "-H", "Idempotency-Key: t1:call_2") == "200"
    assert server.counts()[TOKEN] == 2  # another call's key is another effect


def test_a_request_for_no_step_counts_nothing(server: EffectServer) -> None:
    assert post(server, "../etc/passwd") == "404"
    assert post(server, TOKEN + "/more") == "404"
    assert server.counts() == {} and server.requests == []


def test_count_reads_keys_per_step() -> None:
    reqs = [{"token": "a", "key": "k"}, {"token": "b", "key": "k"}, {"token": "a", "key": "k"}]
    assert count(reqs) == {"a": 1, "b": 1}


def _check(tmp_path: Path, outside: dict[str, int], shown_output: bool) -> str:
    """Step 1 (a shell step) with its effect once in log.txt, shown to the model or not."""
    step = Step(1, "append", "0123abcd")
    (tmp_path / "log.txt").write_text(f"{step.effect_line} a1\n")
    msgs: list[dict[str, object]] = [{"role": "user", "content": "go"}]
    if shown_output:
        msgs += [
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": step.output_line},
        ]  # fmt: skip
    reqs = [
        {"n": 1, "step": 1, "call_id": "c1", "answered": True, "answer": "tool",
         "body": {"messages": msgs[:1]}},
        {"n": 2, "step": 2, "answered": True, "answer": "final", "body": {"messages": msgs}},
    ]  # fmt: skip
    (res,) = check([step], tmp_path, reqs, True, outside=outside)
    assert res.outside == outside.get(step.token, 0)
    return res.cls


def test_the_checker_grades_the_count_at_the_server(tmp_path: Path) -> None:
    """Once in the workspace and shown: once at the server is once, twice is a duplicate
    (the harness sent the effect again), never is lost (the model believes it was made)."""
    token = Step(1, "append", "0123abcd").token
    assert _check(tmp_path, {token: 1}, True) == "once"
    assert _check(tmp_path, {token: 2}, True) == "duplicate"
    assert _check(tmp_path, {}, True) == "lost"


def test_a_step_command_carries_the_key_only_when_the_harness_gives_one(
    tmp_path: Path, server: EffectServer
) -> None:
    step = Step(1, "append", "0123abcd")
    command = step.command(tmp_path / "gates", "a1", server.url)
    (tmp_path / "gates").mkdir()
    for env in ({"DS_CALL_KEY": "t1:call_1"}, {"DS_CALL_KEY": "t1:call_1"}, {}, {}):
        subprocess.run(["sh", "-c", command], cwd=tmp_path, env={"PATH": "/usr/bin:/bin", **env},
                       check=True, capture_output=True, timeout=60)  # fmt: skip
    assert [r["key"] for r in server.requests] == ["t1:call_1", "t1:call_1", None, None]
    assert server.counts() == {step.token: 3}


def _probe(tmp_path: Path, recipe: str, fault: str) -> tuple[dict[str, str], list[object]]:
    skip_unless_available(load(recipe), tmp_path)
    out = tmp_path / "probe"
    p = probe(
        out,
        "--harness",
        recipe,
        "--scenario",
        "exhaustive",
        "--steps",
        "1",
        "--at",
        "effect",
        "--fault",
        fault,
        "--jobs",
        "1",
        "--effect-server",
        "--no-report",
    )
    assert p.code in (0, 1), p.stdout + p.stderr
    kept = json.loads((out / "runs" / "r1.effects.json").read_text())
    return p.summary, kept


@pytest.mark.parametrize(
    "fault",
    ["process", pytest.param("machine", marks=pytest.mark.cgroup)],
)
def test_a_durable_recipe_makes_each_outside_effect_once(tmp_path: Path, fault: str) -> None:
    """langgraph-durable killed right after step 1's effect (its request sent): under
    ``machine`` the adapter finds its command lost and runs it again, and the service
    knows the second request by its key; under ``process`` the command is reattached."""
    s, kept = _probe(tmp_path, "langgraph-durable", fault)
    assert (s["outside_once"], s["outside_duplicate"], s["outside_lost"]) == ("2", "0", "0")
    assert s["duplicate"] == "0" and s["grade"].endswith("exactly-once"), s
    keys = {r["key"] for r in kept}  # type: ignore[index]
    assert len(keys) == 1 and None not in keys, kept


def test_a_plain_recipe_sends_an_interrupted_calls_effect_twice(tmp_path: Path) -> None:
    """langgraph (no key given to its commands) killed right after step 1's request:
    LangGraph runs the call again, and the service gets it twice."""
    s, kept = _probe(tmp_path, "langgraph", "process")
    assert s["outside_duplicate"] == "1" and s["grade"].endswith("at-least-once"), s
    assert [r["key"] for r in kept] == [None, None]  # type: ignore[index]
