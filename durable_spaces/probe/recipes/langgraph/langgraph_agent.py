"""The ``langgraph`` and ``langgraph-async`` recipes' program: LangGraph's prebuilt ReAct
agent with a ``SqliteSaver`` checkpointer, written as a LangGraph user would.

LangGraph ships no shell tool, so the agent has one of its own, ``bash`` (argument
``command``): ``bash -c`` in the working directory (the probe's workdir), its output and
stderr, and its exit status when not 0. The thread's checkpoints live in
``<state>/checkpoints.sqlite`` under one fixed thread id. The same program launches and
resumes: with a checkpoint of the thread, it continues it as LangGraph documents
(``invoke(None, config)``: the pending node runs again from its start; nothing runs on a
thread that ended); with none (a kill before the first checkpoint), it starts the task.
``--durability`` is the graph's checkpoint durability: ``sync`` (``langgraph``) or
``async`` (``langgraph-async``, LangGraph's default).
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from pydantic import SecretStr

with warnings.catch_warnings():  # create_react_agent is still LangGraph's prebuilt agent
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent

THREAD = {"configurable": {"thread_id": "probe"}}


@tool
def bash(command: str) -> str:
    """Run a shell command in the workspace; returns its output and exit status."""
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    out = done.stdout + done.stderr
    return out if done.returncode == 0 else f"{out}\n(exit status {done.returncode})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-url", required=True)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--durability", choices=("sync", "async", "exit"), default="sync")
    ap.add_argument("--resume", action="store_true", help="continue the thread (launch: start)")
    args = ap.parse_args()
    args.state.mkdir(parents=True, exist_ok=True)
    model = ChatOpenAI(
        model="fake-model", base_url=args.model_url, api_key=SecretStr("dummy"), max_retries=0
    )
    conn = sqlite3.connect(args.state / "checkpoints.sqlite", check_same_thread=False)
    agent: Any = create_react_agent(model, [bash], checkpointer=SqliteSaver(conn))
    if agent.get_state(THREAD).values.get("messages"):
        # Continue the thread, even when it looks ended: with async durability the last
        # node's writes may be kept without the checkpoint after them (its ``next`` then
        # reads empty). On a thread that did end, this runs nothing and returns its state.
        result = agent.invoke(None, THREAD, durability=args.durability)
    else:  # no checkpoint yet (killed before the first): start the task
        start = {"messages": [("user", args.prompt)]}
        result = agent.invoke(start, THREAD, durability=args.durability)
    print(result["messages"][-1].content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
