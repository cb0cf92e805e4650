"""pydantic-ai's durable toolset in pydantic-ai's own agent (``OpenAIChatModel`` against the
scripted model): the three tools, and a run continued from a message history that lost
its tail, whose model then answers with new tool call ids. DBOS's recovery is tried end
to end with real kills by the ``pydantic-ai-dbos-durable`` recipe's tests
(tests/probe/recipes/)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from needs import need
from scripts import FINAL, appends, scripted
from workspaces import attempts

need("probe-harnesses")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

from durable_spaces.integrations import DurableWorkspace  # noqa: E402
from durable_spaces.integrations.pydantic_ai import durable_toolset  # noqa: E402


def agent(ws: DurableWorkspace, url: str) -> Agent[None, str]:
    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=url, api_key="x"))
    return Agent(model, toolsets=[durable_toolset(ws)], retries=0)


def test_the_tools_act_in_the_workspace_and_say_how(tmp_path: Path) -> None:
    calls = [
        ("write", {"path": "notes.txt", "content": "one\nslot\n"}),
        ("edit", {"path": "notes.txt", "old_text": "slot", "new_text": "two"}),
        ("bash", {"command": 'cat notes.txt; printf %s "$DS_CALL_KEY"'}),
    ]
    with attempts(tmp_path) as a, scripted(calls) as (script, url):
        result = asyncio.run(agent(a.attempt(), url).run("go"))
        returns = [
            p.content
            for m in result.all_messages()
            for p in m.parts
            if p.part_kind == "tool-return"
        ]
        thread = result.all_messages()[-1].conversation_id
        assert returns[2] == f"one\ntwo\n{thread}:{script.ids[2]}\n[exit code 0]"
        assert result.output == FINAL


def test_a_history_that_lost_its_tail_finds_the_space_as_it_was_then(tmp_path: Path) -> None:
    """Steps a and b ran; the run is continued (a new process) from the history up to
    a's return, and the model answers with a new id and another command: b's effect is
    gone before the new call runs."""
    with attempts(tmp_path) as a, scripted(appends("a", "b")) as (script, url):
        first = asyncio.run(agent(a.attempt(), url).run("go"))
        assert a.log() == ["a", "b"]
        history: list[Any] = first.all_messages()[:3]  # the prompt, a's call, a's return
        a.made[0].close()
        script.round, script.calls = 2, appends("a", "c")
        again = asyncio.run(agent(a.attempt(), url).run(message_history=history))
        assert a.log() == ["a", "c"]
        assert again.output == FINAL
