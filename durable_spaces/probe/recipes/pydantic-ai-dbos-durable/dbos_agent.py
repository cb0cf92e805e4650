"""The ``pydantic-ai-dbos-durable`` recipe's program: the ``pydantic-ai-dbos`` recipe's
program (a pydantic-ai agent made durable by DBOS on a SQLite system database) with only
its tools replaced by durable-spaces' pydantic-ai integration
(``durable_spaces.integrations.pydantic_ai``): ``bash``, ``write`` and ``edit`` acting in
the working directory (the probe's workdir) through the adapter, whose log lives in
``<state>/workspace``. The diff from ``../pydantic-ai-dbos/dbos_agent.py`` is the user's
whole change (docs/integrations-pydantic-ai.md shows it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from dbos import DBOS, SetWorkflowID, WorkflowHandleAsync
from pydantic_ai import Agent
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from durable_spaces.integrations.pydantic_ai import durable_toolset

WORKFLOW_ID = "probe-task"
POLL_S = 0.05  # how often the result is looked for (DBOS's default: every second)


def _arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-url", required=True)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--resume", action="store_true", help="recover the workflow")
    return ap.parse_args()


ARGS = _arguments()  # DBOS registers workflows and steps at import, before launch
ARGS.state.mkdir(parents=True, exist_ok=True)
DBOS(
    config={
        "name": "probe-pydantic-ai",
        "system_database_url": f"sqlite:///{ARGS.state / 'dbos.sqlite'}",
    }
)
model = OpenAIChatModel(
    "fake-model", provider=OpenAIProvider(base_url=ARGS.model_url, api_key="dummy")
)
agent = Agent(
    model,
    name="probe",
    instructions="You are a coding agent. Use the bash tool when asked.",
    toolsets=[durable_toolset(ARGS.state / "workspace", workspace=".")],
    capabilities=[DBOSDurability()],
    retries=0,
)


@DBOS.workflow()
async def task(prompt: str) -> str:
    result = await agent.run(prompt)
    return result.output


async def main() -> int:
    DBOS.launch()  # recovers this program's pending workflows, in the background
    handle: WorkflowHandleAsync[str] | None = None
    if ARGS.resume:
        try:
            handle = await DBOS.retrieve_workflow_async(WORKFLOW_ID)
        except Exception as e:  # DBOS's "no such workflow": killed before it was recorded
            if "NonExistent" not in type(e).__name__:
                raise
    if handle is None:
        with SetWorkflowID(WORKFLOW_ID):
            handle = await DBOS.start_workflow_async(task, ARGS.prompt)
    print(await handle.get_result(polling_interval_sec=POLL_S))
    return 0


if __name__ == "__main__":
    code = asyncio.run(main())
    sys.stdout.flush()
    os._exit(code)  # DBOS's threads would hold the exit up; the result is recorded
