"""The scripted model's determinism and the OpenAI model against a local fake server."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from durable_spaces.campaigns.checks.workload import parse_append
from durable_spaces.harness.env import ExecutionEnv, LocalDirEnv
from durable_spaces.harness.log import MemoryStorage
from durable_spaces.harness.models import OpenAIModel, check_gate
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.testing import (
    ScriptedModel,
    fake_openai_server,
    implied_workspace,
    text_reply,
    tool_call_reply,
)


async def _run(model: Any, root: Path, steps_input: str = "go") -> Harness:
    async def env(cid: str) -> ExecutionEnv:
        return LocalDirEnv(root)

    h = await Harness.open(
        MemoryStorage(), models={"m": model}, registry=Registry().install(CodingTools), env=env
    )
    conv = await h.root(AgentConfig("m", system="you are a test"))
    settled = await (await conv.submit(steps_input)).wait()
    assert settled.status == "done", settled
    return h


async def test_scripted_model_is_a_function_of_the_transcript(tmp_path: Path) -> None:
    runs = []
    for i in range(2):
        d = tmp_path / f"run{i}"
        d.mkdir()
        h = await _run(ScriptedModel("seed-a", 12, sleep=0.01), d)
        runs.append([(e.kind, e.data) for e in (await h.root()).entries()])
    assert runs[0] == runs[1]
    other = await _run(ScriptedModel("seed-b", 12), tmp_path)
    assert [(e.kind, e.data) for e in (await other.root()).entries()] != runs[0]


async def test_scripted_model_never_fails_and_matches_the_workspace(tmp_path: Path) -> None:
    kinds: set[str] = set()
    for seed in range(6):
        d = tmp_path / str(seed)
        d.mkdir()
        h = await _run(ScriptedModel(seed, 10, files=3), d)
        entries = (await h.root()).entries()
        results = [e for e in entries if e.kind == "tool_result"]
        assert len(results) == 10 and all(r.data["status"] == "ok" for r in results)
        kinds |= {r.data["name"] for r in results}
        files = {p.name: p.read_text() for p in d.iterdir()}
        assert files == implied_workspace(entries)
        journal = files.get("journal.txt", "").splitlines()
        assert len(journal) == len(set(journal))
    assert kinds == {"write", "edit", "bash"}


def test_interpret_bash() -> None:
    m = ScriptedModel(1, 1, sleep=0.25)
    call = m.call(0, {})
    while call.name != "bash":  # find a bash step for this seed
        m = ScriptedModel(m.seed + 1, 1, sleep=0.25)  # type: ignore[operator]
        call = m.call(0, {})
    assert call.args["command"].startswith("sleep 0.25 && printf '%s\\n' 's0-")
    path, line = ScriptedModel.interpret_bash(call.args["command"]) or ("", "")
    assert path == "journal.txt" and line.startswith("s0-")
    assert ScriptedModel.interpret_bash("rm -rf /") is None


def test_a_gated_command_holds_until_its_gate_exists(tmp_path: Path) -> None:
    gate = tmp_path / "the gate"
    call = ScriptedModel("1", 1, gate=str(gate)).call(0, {})  # seed 1's step 0 is a bash
    command = call.args["command"]
    token = ScriptedModel("1", 1).call(0, {}).args["command"].split("'")[-2]
    assert ScriptedModel.interpret_bash(command) == ("journal.txt", token)
    assert parse_append(command) == ("journal.txt", token)  # the checker's reading too
    shell = subprocess.Popen(["bash", "-c", command], cwd=tmp_path)
    try:
        waiting = psutil.Process(shell.pid)
        # Its loop's first sleep: the gate was looked at, found missing, and waited for.
        deadline = time.monotonic() + 300  # a hang, not a pace
        while not any(c.name() == "sleep" for c in waiting.children()):
            assert shell.poll() is None, "the command ended without its gate"
            assert time.monotonic() < deadline, "the command never waited"
            time.sleep(0.01)
        assert not (tmp_path / "journal.txt").exists()
        gate.touch()
        assert shell.wait(timeout=300) == 0
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait()
    assert (tmp_path / "journal.txt").read_text() == f"{token}\n"


@pytest.mark.parametrize("bad", ["gate", "/tmp/it's", "/tmp/a\nb"])
def test_a_gate_that_is_no_absolute_quotable_path_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="gate"):
        check_gate(bad)
    with pytest.raises(ValueError, match="gate"):
        ScriptedModel("1", 1, gate=bad)


async def test_openai_model_against_a_fake_server(tmp_path: Path) -> None:
    replies = [
        tool_call_reply("write", {"path": "hello.txt", "content": "hi\n"}, call_id="call_w"),
        text_reply("all written"),
    ]
    with fake_openai_server(replies) as srv:
        model = OpenAIModel("fake-model", base_url=srv.base_url, api_key="test-key")
        h = await _run(model, tmp_path, "write hello")
        assert (tmp_path / "hello.txt").read_text() == "hi\n"
        entries = (await h.root()).entries()
        assert entries[-1].data == {"content": "all written", "tool_calls": []}
        first, second = srv.requests
    assert first["model"] == "fake-model"
    assert [t["function"]["name"] for t in first["tools"]] == ["read", "write", "edit", "bash"]
    assert first["messages"] == [
        {"role": "system", "content": "you are a test"},
        {"role": "user", "content": "write hello"},
    ]
    assert second["messages"][2]["tool_calls"][0]["id"] == "call_w"
    assert second["messages"][3]["role"] == "tool"
    assert second["messages"][3]["tool_call_id"] == "call_w"


def test_fake_server_streams_and_answers_from_the_request() -> None:
    """A reply chosen by a function of the request (a resend gets the same answer), and
    streamed as SSE when asked: the openai client puts the tool call back together."""
    from openai import OpenAI

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        if any(m["role"] == "tool" for m in body["messages"]):
            return text_reply("finished")
        return tool_call_reply("bash", {"command": "echo s1"}, call_id="call_s1")

    with fake_openai_server(reply) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="dummy")
        assert [m.id for m in client.models.list()] == ["fake"]
        user = [{"role": "user", "content": "go"}]
        for _ in range(2):  # the same request twice: the same answer
            chunks = list(client.chat.completions.create(model="m", messages=user, stream=True))
            calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices]
            (call,) = [tc for tcs in calls if tcs for tc in tcs]
            assert (call.id, call.function.name) == ("call_s1", "bash")
            assert json.loads(call.function.arguments) == {"command": "echo s1"}
        tool = {"role": "tool", "tool_call_id": "call_s1", "content": "s1"}
        done = client.chat.completions.create(model="m", messages=[*user, tool])
        assert done.choices[0].message.content == "finished"
        assert len(srv.requests) == 3 and srv.requests[0]["stream"] is True
