"""The integrations' docs pages' examples, run as their users run them: the first
``python`` block of ``docs/integrations-<framework>.md``, a program of its own in a
fresh directory, its model the scripted chat server (``OPENAI_BASE_URL``): a ``bash``
call that makes ``project/README.md``, an ``edit`` of it, then the answer."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_spaces.backends.local.backend import LocalBackend
from durable_spaces.testing import FakeOpenAIServer, text_reply, tool_call_reply

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("langgraph", "openai-agents", "pydantic-ai")
ANSWER = "The README is there."
README = "# My project\n"


def example(framework: str) -> str:
    """The page's first ``python`` block."""
    page = (ROOT / "docs" / f"integrations-{framework}.md").read_text()
    found = re.search(r"^```python\n(.*?)^```", page, re.S | re.M)
    assert found is not None, f"docs/integrations-{framework}.md has no python example"
    return found.group(1)


def reply(body: dict[str, Any]) -> dict[str, Any]:
    done = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
    if done == 0:
        return tool_call_reply("bash", {"command": "echo '# Project' > README.md"}, "call_1")
    if done == 1:
        args = {"path": "README.md", "old_text": "Project", "new_text": "My project"}
        return tool_call_reply("edit", args, "call_2")
    return text_reply(ANSWER)


@dataclass
class ExampleRun:
    code: int
    out: str
    seconds: float
    requests: int


def run_example(
    python: str, framework: str, where: Path, *, clean: bool = False, runs: int = 2
) -> list[ExampleRun]:
    """Run the example ``runs`` times in ``where`` with ``python`` (the second run finds
    the task done: nothing runs again); ``clean``: an interpreter of its own, which must
    not see this checkout (no ``PYTHONPATH``)."""
    program = where / "example.py"
    program.write_text(example(framework))
    server = FakeOpenAIServer(reply).start()
    env = {
        **os.environ,
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": "dummy",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
        "DBOS__CLOUD": "false",
        "DO_NOT_TRACK": "1",
    }
    if clean:
        env.pop("PYTHONPATH", None)
    out = []
    try:
        for _ in range(runs):
            began = time.monotonic()
            done = subprocess.run(
                [python, str(program)], cwd=where, env=env, capture_output=True, text=True,
                timeout=300, check=False,
            )  # fmt: skip
            out.append(
                ExampleRun(
                    done.returncode,
                    done.stdout + done.stderr,
                    time.monotonic() - began,
                    len(server.requests),
                )
            )
    finally:
        server.stop()
        delete_spaces(where / "agent-state" / "workspace" / "spaces")
    return out


def delete_spaces(spaces: Path) -> None:
    """Delete the Spaces under ``spaces`` (their fork servers and commands with them:
    a test leaves no process behind)."""
    if not spaces.is_dir():
        return
    backend = LocalBackend(spaces)

    async def delete_all() -> None:
        for name in await backend.names():
            await backend.delete(name)
        await backend.close()

    asyncio.run(delete_all())


def check_example(runs: list[ExampleRun], where: Path) -> None:
    """The task done once: the README made and edited, the model's answer printed, and
    the second run asked the model once more (the answer) and ran nothing."""
    first, second = runs
    assert first.code == 0, first.out[-3000:]
    assert ANSWER in first.out, first.out[-3000:]
    assert (where / "project" / "README.md").read_text() == README
    assert second.code == 0, second.out[-3000:]
    assert (where / "project" / "README.md").read_text() == README
    assert second.requests - first.requests <= 1, second.out[-3000:]
