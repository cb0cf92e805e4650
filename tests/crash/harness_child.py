"""A driver process for the harness crash tests: run (or resume) one scripted conversation.

    python harness_child.py STORAGE_URL WORKDIR SEED STEPS REQUEST_ID [--sleep S] [--safe-bash]

Failpoints come from DS_FAILPOINTS (the n-th hit SIGKILLs this process). ``child.mid_bash``
is hit while a bash command is still running. ``--safe-bash`` declares bash replay-safe
(through a wrapping extension) so a cut-off bash call runs again instead of ending
interrupted. Prints the settled outcome as JSON and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from durable_spaces.chaos.failpoints import hit
from durable_spaces.harness.env import ExecutionEnv, LocalDirEnv
from durable_spaces.harness.log import open_storage
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import (
    CodingTools,
    Extension,
    Registry,
    Tool,
    ToolContext,
    ToolResult,
)
from durable_spaces.testing import ScriptedModel


def mid_bash(safe: bool) -> Extension:
    def wrap(inner: Tool) -> Tool:
        async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            ctx.output(f"$ {args.get('command')}\n")  # live output, committed while it runs
            run = asyncio.ensure_future(inner.execute(args, ctx))
            await asyncio.sleep(0.03)
            if not run.done():
                hit("child.mid_bash")
            return await run

        return inner.with_execute(execute, replay="safe" if safe else inner.replay)

    return Extension("crash-test", wrap={"bash": wrap})


async def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("storage")
    p.add_argument("workdir")
    p.add_argument("seed")
    p.add_argument("steps", type=int)
    p.add_argument("request_id")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--safe-bash", action="store_true")
    a = p.parse_args()

    async def env(cid: str) -> ExecutionEnv:
        return LocalDirEnv(a.workdir)

    storage = open_storage(a.storage)
    registry = Registry().install(CodingTools).install(mid_bash(a.safe_bash))
    model = ScriptedModel(a.seed, a.steps, sleep=a.sleep)
    harness = await Harness.open(storage, models={"scripted": model}, registry=registry, env=env)
    harness.resume()
    root = await harness.root(AgentConfig("scripted"))
    submission = await root.submit("run the script", request_id=a.request_id)
    settled = await submission.wait()
    hit("child.settled")  # a random-time kill's test holds the child here (a stop)
    await harness.close()
    storage.close()
    print(json.dumps({"status": settled.status, "answer": settled.answer, "error": settled.error}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
