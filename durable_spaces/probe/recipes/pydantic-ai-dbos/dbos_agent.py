"""The ``pydantic-ai-dbos`` and ``pydantic-ai-dbos-steps`` recipes' program: a pydantic-ai
agent made durable by DBOS (the ``DBOSDurability`` capability) on a SQLite system
database, written as pydantic-ai's durable-execution docs show.

The agent's run is a ``@DBOS.workflow`` with one fixed workflow id; DBOS keeps it in
``<state>/dbos.sqlite``. Its shell tool, ``bash`` (argument ``command``), runs ``bash -c``
in the working directory (the probe's workdir). With ``--steps`` the tool's body is a
``@DBOS.step`` (its result recorded, not run again once recorded); without, it is a plain
tool, which DBOS does not record (only model requests are steps). Launch starts the
workflow; resume launches DBOS again, which recovers the pending workflow, and waits for
its result (a workflow that was never recorded is started).
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

WORKFLOW_ID = "probe-task"
POLL_S = 0.05  # how often the result is looked for (DBOS's default: every second)


def _arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-url", required=True)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--steps", action="store_true", help="the tool's body is a DBOS step")
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
    capabilities=[DBOSDurability()],
    retries=0,
)


async def _run_bash(command: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=os.getcwd(),
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    return text if proc.returncode == 0 else f"{text}\n(exit status {proc.returncode})"


@DBOS.step()
async def bash_step(command: str) -> str:
    return await _run_bash(command)


@agent.tool_plain
async def bash(command: str) -> str:
    """Run a shell command in the workspace; returns its output and exit status.

    Args:
        command: the shell command to run.
    """
    return await (bash_step(command) if ARGS.steps else _run_bash(command))


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
