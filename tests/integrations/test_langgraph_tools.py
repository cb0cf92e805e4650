"""LangGraph's durable tools in LangGraph's own prebuilt agent (a real ``SqliteSaver``,
``ChatOpenAI`` against the scripted model): the three tools as LangGraph's tool node runs
them, and a thread resumed from a checkpoint older than the Space's last effect, whose
model then answers with new tool call ids."""

from __future__ import annotations

import asyncio
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest
from needs import need
from scripts import FINAL, appends, scripted
from workspaces import attempts

need("probe-harnesses")

from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from durable_spaces.integrations import DurableWorkspace  # noqa: E402
from durable_spaces.integrations.langgraph import durable_tools  # noqa: E402
from durable_spaces.testing import fake_openai_server, text_reply, tool_call_reply  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent


def agent(ws: DurableWorkspace, url: str, db: Path | None) -> Any:
    """The prebuilt agent on the durable tools, its checkpoints in ``db`` (in memory:
    None, for ``ainvoke``: ``SqliteSaver`` is sync only)."""
    model = ChatOpenAI(model="m", base_url=url, api_key=SecretStr("x"), max_retries=0)
    saver = (
        InMemorySaver() if db is None else SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    )
    return create_react_agent(model, durable_tools(ws), checkpointer=saver)


THREAD = {"configurable": {"thread_id": "t1"}}


@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_the_tools_act_in_the_workspace_and_say_how(tmp_path: Path, run: str) -> None:
    calls = [
        ("write", {"path": "notes.txt", "content": "one\nslot\n"}),
        ("edit", {"path": "notes.txt", "old_text": "slot", "new_text": "two"}),
        ("bash", {"command": 'cat notes.txt; printf %s "$DS_CALL_KEY"; exit 3'}),
    ]
    with attempts(tmp_path) as a, scripted(calls) as (script, url):
        g = agent(a.attempt(), url, tmp_path / "lg.sqlite" if run == "invoke" else None)
        start = {"messages": [("user", "go")]}
        out = g.invoke(start, THREAD) if run == "invoke" else asyncio.run(g.ainvoke(start, THREAD))
        tools = [m for m in out["messages"] if m.type == "tool"]
        assert (a.work / "notes.txt").read_text() == "one\ntwo\n"
        assert tools[2].content == f"one\ntwo\nt1:{script.ids[2]}\n[exit code 3]"
        assert tools[2].artifact == {
            "status": "error",
            "exit_code": 3,
            "call_key": f"t1:{script.ids[2]}",
        }
        assert out["messages"][-1].content == FINAL


def test_a_thread_resumed_from_an_older_checkpoint_finds_the_space_as_it_was_then(
    tmp_path: Path,
) -> None:
    """The thread ran steps a and b; it is resumed, in a new process, from the checkpoint
    after a's result (a lost tail, or LangGraph's own time travel), and the model asked
    again answers with a new id and another command: b's effect is gone from the Space
    before the new call runs, and each effect is there once."""
    with attempts(tmp_path) as a, scripted(appends("a", "b")) as (script, url):
        db = tmp_path / "lg.sqlite"
        g = agent(a.attempt(), url, db)
        g.invoke({"messages": [("user", "go")]}, THREAD)
        assert a.log() == ["a", "b"]
        after_a = next(
            s for s in g.get_state_history(THREAD)
            if [m.type for m in s.values["messages"]] == ["human", "ai", "tool"]
        )  # fmt: skip
        a.made[0].close()
        script.round, script.calls = 2, appends("a", "c")
        g = agent(a.attempt(), url, db)
        out = g.invoke(None, after_a.config)
        assert a.log() == ["a", "c"]
        assert out["messages"][-1].content == FINAL
        assert "log_behind" in a.kinds()


def test_a_message_of_two_calls_runs_both_once(tmp_path: Path) -> None:
    """LangGraph's tools node runs a message's calls at once (sync: in a pool of threads):
    each runs once, one at a time in the Space."""
    two = tool_call_reply("bash", {"command": "echo x >> log.txt"}, call_id="call_x")
    two["choices"][0]["message"]["tool_calls"].append(
        tool_call_reply("bash", {"command": "echo y >> log.txt"}, call_id="call_y")["choices"][0][
            "message"
        ]["tool_calls"][0]
    )
    replies = [two, text_reply(FINAL)]
    with attempts(tmp_path) as a, fake_openai_server(replies) as server:
        g = agent(a.attempt(), server.base_url, tmp_path / "lg.sqlite")
        out = g.invoke({"messages": [("user", "go")]}, THREAD)
        assert sorted(a.log()) == ["x", "y"]
        assert out["messages"][-1].content == FINAL
