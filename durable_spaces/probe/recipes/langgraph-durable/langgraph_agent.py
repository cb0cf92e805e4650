"""The ``langgraph-durable`` and ``langgraph-async-durable`` recipes' program: the
``langgraph`` recipe's program (LangGraph's prebuilt ReAct agent with a ``SqliteSaver``
checkpointer) with only its tools replaced by durable-spaces' LangGraph integration
(``durable_spaces.integrations.langgraph``): ``bash``, ``write`` and ``edit`` acting in
the working directory (the probe's workdir) through the adapter, whose log lives in
``<state>/workspace``. The diff from ``../langgraph/langgraph_agent.py`` is the user's
whole change (docs/integrations-langgraph.md shows it).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import warnings
from pathlib import Path
from typing import Any

from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from pydantic import SecretStr

from durable_spaces.integrations.langgraph import durable_tools

with warnings.catch_warnings():  # create_react_agent is still LangGraph's prebuilt agent
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent

THREAD = {"configurable": {"thread_id": "probe"}}


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
    tools = durable_tools(args.state / "workspace", workspace=".")
    agent: Any = create_react_agent(model, tools, checkpointer=SqliteSaver(conn))
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
