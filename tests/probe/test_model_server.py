"""The scripted model, asked by a real OpenAI client: JSON and SSE, call ids new at every
answer (the same for the same seed), deciding from what it was shown wherever shown, every
request recorded, refusing what it cannot answer."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from durable_spaces.probe.model_server import MAX_ASKS, ModelServer
from durable_spaces.probe.recipe import load
from durable_spaces.probe.task import plan
from tests.probe.helpers import write_recipe

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    r = load(str(write_recipe(tmp_path / "r", "none")))
    s = ModelServer(plan(2, r, "abcdef01"), r, tmp_path / "gates", seed="t-1")
    yield s
    s.close()


def _client(s: ModelServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url, api_key="dummy", max_retries=0)


def test_json_and_stream_answer_the_same_call(server: ModelServer) -> None:
    c = _client(server)
    msgs = [{"role": "user", "content": "go"}]
    a = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
    call = a.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.id.startswith("call_") and call.function.name == "bash"  # type: ignore[union-attr]
    cmd = json.loads(call.function.arguments)["command"]  # type: ignore[union-attr]
    assert "O pabcdef01s1" not in cmd  # the output is never spelled in the command
    args, ids = "", set()
    for ch in c.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=True):  # type: ignore[arg-type]
        for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            args += tc.function.arguments or ""  # type: ignore[union-attr]
            ids.add(tc.id)
    # the same step asked again: the same command but for the answer it names, a new id
    assert json.loads(args)["command"] == cmd.replace("' a0'", "' a1'") != cmd
    assert call.id not in ids and len(ids - {None}) == 1
    assert [q["step"] for q in server.requests] == [1, 1]
    again = ModelServer(server.steps, server.recipe, server.gates, seed="t-1")
    try:  # a pure function of the seed and the answer's index: a seed replays
        b = _client(again).chat.completions.create(model="m", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        assert b.choices[0].message.tool_calls[0].id == call.id  # type: ignore[index]
    finally:
        again.close()


def test_it_asks_again_for_a_step_it_has_not_seen_done(server: ModelServer) -> None:
    c = _client(server)
    call = {"id": "renamed", "type": "function",
            "function": {"name": "bash", "arguments": "printf x pabcdef01 s1"}}  # fmt: skip
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "renamed", "content": '{"error": null}'}]  # fmt: skip
    for _ in range(MAX_ASKS):  # no output and no report: the step again, as many times
        a = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        assert "pabcdef01 s1" in a.choices[0].message.tool_calls[0].function.arguments  # type: ignore[index,union-attr]
    a = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
    assert "pabcdef01 s2" in a.choices[0].message.tool_calls[0].function.arguments  # type: ignore[index,union-attr]
    # its output shown in a user message (a summary), not as a tool result: seen all the same
    summary = [{"role": "user", "content": "done so far: O pabcdef01s1\nO pabcdef01s2"}]
    a = c.chat.completions.create(model="m", messages=summary, tools=TOOLS)  # type: ignore[arg-type]
    assert a.choices[0].message.content and not a.choices[0].message.tool_calls
    assert server.requests[-1]["step"] == 3 and server.requests[-1]["answer"] == "final"


def test_what_it_cannot_answer_is_a_problem(server: ModelServer) -> None:
    c = _client(server)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "go"}],
            tools=[{"type": "function", "function": {"name": "shell"}}],
        )  # type: ignore[list-item]
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="m", input="go")
    assert server.problems[0] == ("the harness offers the model the tools [shell]: the "
                                  "recipe's tool 'bash' is not among them")  # fmt: skip
    assert "Responses" not in server.problems[0] and "/v1/responses" in server.problems[1]
