"""The Agents SDK's durable tools in the SDK's own ``Runner`` with a ``SQLiteSession``
(Chat Completions against the scripted model): the three tools, an error of the fence
raised out of the run, and a session that lost its last turn, whose model then answers
with new tool call ids."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from needs import need
from scripts import FINAL, appends, scripted
from workspaces import attempts

need("probe-harnesses")

from agents import (  # noqa: E402
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    SQLiteSession,
    set_tracing_disabled,
)
from agents.exceptions import UserError  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from durable_spaces.errors import StaleEpochError  # noqa: E402
from durable_spaces.integrations import DurableWorkspace  # noqa: E402
from durable_spaces.integrations.openai_agents import durable_tools  # noqa: E402

set_tracing_disabled(True)


def run(ws: DurableWorkspace, url: str, session: SQLiteSession, message: str = "go") -> Any:
    client = AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
    agent = Agent(
        name="t",
        tools=durable_tools(ws, session=session),
        model=OpenAIChatCompletionsModel(model="m", openai_client=client),
    )
    return asyncio.run(Runner.run(agent, message, session=session))


def test_the_tools_act_in_the_workspace_and_say_how(tmp_path: Path) -> None:
    calls = [
        ("write", {"path": "notes.txt", "content": "one\nslot\n"}),
        ("edit", {"path": "notes.txt", "old_text": "slot", "new_text": "two"}),
        ("bash", {"command": 'cat notes.txt; printf %s "$DS_CALL_KEY"'}),
    ]
    with attempts(tmp_path) as a, scripted(calls) as (script, url):
        session = SQLiteSession("s1", tmp_path / "session.sqlite")
        result = run(a.attempt(), url, session)
        outputs = [i["output"] for i in asyncio.run(session.get_items()) if "output" in i]
        assert outputs[2] == f"one\ntwo\ns1:{script.ids[2]}\n[exit code 0]"
        assert result.final_output == FINAL


def test_a_newer_attempt_stops_the_run_of_an_older_one(tmp_path: Path) -> None:
    """A process whose epoch a newer one passed: the fence's error leaves the run (the
    SDK wraps it in its ``UserError``), and the session saves no output for the call."""
    with attempts(tmp_path) as a, scripted(appends("a", "b")) as (_, url):
        old = a.attempt()
        a.call("bash", {"command": "true"}, "first", thread="s1")  # its epoch taken
        a.attempt()
        a.call("bash", {"command": "true"}, "other", ["first"], thread="s1")  # a newer one
        session = SQLiteSession("s1", tmp_path / "session.sqlite")
        with pytest.raises(UserError) as raised:
            run(old, url, session)
        assert isinstance(raised.value.__cause__, StaleEpochError)
        items = asyncio.run(session.get_items())
        assert not [i for i in items if i.get("type") == "function_call_output"]
        assert a.log() == []


def test_a_session_that_lost_its_last_turn_finds_the_space_as_it_was_then(
    tmp_path: Path,
) -> None:
    """Steps a and b ran; the session loses b's turn and the answer after it; a new
    process goes on and the model, asked again, answers with a new id and another
    command: b's effect is gone before the new call runs."""
    with attempts(tmp_path) as a, scripted(appends("a", "b")) as (script, url):
        session = SQLiteSession("s1", tmp_path / "session.sqlite")
        run(a.attempt(), url, session)
        assert a.log() == ["a", "b"]
        for _ in range(3):  # b's call, its output, the final answer
            asyncio.run(session.pop_item())
        a.made[0].close()
        script.round, script.calls = 2, appends("a", "c")
        result = run(a.attempt(), url, session, "continue")
        assert a.log() == ["a", "c"]
        assert result.final_output == FINAL
