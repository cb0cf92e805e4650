"""The ``openai-agents-durable`` recipe's program: the ``openai-agents`` recipe's program
(the OpenAI Agents SDK with a ``SQLiteSession``) with only its tools replaced by
durable-spaces' Agents SDK integration (``durable_spaces.integrations.openai_agents``):
``bash``, ``write`` and ``edit`` acting in the working directory (the probe's workdir)
through the adapter, whose log lives in ``<state>/workspace``. The diff from
``../openai-agents/agents_agent.py`` is the user's whole change
(docs/integrations-openai-agents.md shows it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    SQLiteSession,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from durable_spaces.integrations.openai_agents import durable_tools


async def run(args: argparse.Namespace) -> str:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=args.model_url, api_key="dummy", max_retries=0)
    session = SQLiteSession("probe", args.state / "session.sqlite")
    agent = Agent(
        name="probe",
        instructions="You are a coding agent. Use the bash tool when asked.",
        tools=durable_tools(args.state / "workspace", session=session, workspace="."),
        model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client),
    )
    message = "continue" if args.resume and await session.get_items() else args.prompt
    result = await Runner.run(agent, message, session=session, max_turns=100)
    return str(result.final_output)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-url", required=True)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--resume", action="store_true", help="continue the session")
    args = ap.parse_args()
    args.state.mkdir(parents=True, exist_ok=True)
    print(asyncio.run(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
