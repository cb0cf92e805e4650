"""The ``openai-agents`` recipe's program: the OpenAI Agents SDK (``agents``) with a
``SQLiteSession``, as a user of the SDK writes it.

The SDK's shell tools need the Responses API; this agent speaks Chat Completions
(``OpenAIChatCompletionsModel``), so its shell tool is a ``function_tool`` of its own,
``bash`` (argument ``command``): ``bash -c`` in the working directory (the probe's
workdir). Tracing is off. The conversation lives in ``<state>/session.sqlite`` under one
fixed session id. Launch runs the prompt; resume continues the same session: with items
in it, ``continue`` (as ``pi -c "continue"`` does); with none (a kill before the first
was saved), the prompt again.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    SQLiteSession,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


@function_tool
def bash(command: str) -> str:
    """Run a shell command in the workspace; returns its output and exit status.

    Args:
        command: the shell command to run.
    """
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    out = done.stdout + done.stderr
    return out if done.returncode == 0 else f"{out}\n(exit status {done.returncode})"


async def run(args: argparse.Namespace) -> str:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=args.model_url, api_key="dummy", max_retries=0)
    agent = Agent(
        name="probe",
        instructions="You are a coding agent. Use the bash tool when asked.",
        tools=[bash],
        model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client),
    )
    session = SQLiteSession("probe", args.state / "session.sqlite")
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
