"""A scripted OpenAI-compatible model for the frameworks' tests (``durable_spaces.testing``'s
chat server): step ``k`` is asked for when the request holds ``k - 1`` tool results, each
a tool call whose id carries the ``round`` (a model asked again after a crash answers
with new ids when the test moves the round on), then a plain answer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from durable_spaces.testing import FakeOpenAIServer, text_reply, tool_call_reply

FINAL = "All steps are done."


@dataclass
class Script:
    calls: list[tuple[str, dict[str, Any]]]
    round: int = 1
    ids: list[str] = field(default_factory=list)  # every call id the model answered

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
        if done >= len(self.calls):
            return text_reply(FINAL)
        name, args = self.calls[done]
        call_id = f"call_r{self.round}_s{done + 1}"
        self.ids.append(call_id)
        return tool_call_reply(name, args, call_id=call_id)


@contextmanager
def scripted(calls: list[tuple[str, dict[str, Any]]]) -> Iterator[tuple[Script, str]]:
    """The script and the server's base URL."""
    script = Script(calls)
    server = FakeOpenAIServer(script.reply).start()
    try:
        yield script, server.base_url
    finally:
        server.stop()


def appends(*words: str) -> list[tuple[str, dict[str, Any]]]:
    return [("bash", {"command": f"echo {w} >> log.txt"}) for w in words]
