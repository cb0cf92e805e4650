"""A ``DurableWorkspace`` on the local backend for the integrations' tests, called as a
framework would (``FrameworkCall``: the tool, its arguments, the thread, the call's id and
what the framework holds), one attempt (process) after another, and the log read back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from examples import delete_spaces

from durable_spaces.adapter.config import Mode
from durable_spaces.adapter.recovery import RecoveryEvent
from durable_spaces.harness.log import SqliteStorage
from durable_spaces.harness.scheduler import Harness
from durable_spaces.harness.tools import Registry, ToolResult
from durable_spaces.integrations import DurableWorkspace, FrameworkCall, Knowledge


class Attempts:
    """Each ``attempt()`` is a new process's workspace (a new epoch) on the same state
    directory and workdir; ``call`` runs on the newest."""

    def __init__(self, root: Path, mode: Mode = "auto", pinned: bool = True) -> None:
        self.state = root / "state"
        self.work = root / "work"
        self.work.mkdir(exist_ok=True)
        self.mode: Mode = mode
        self.pinned = pinned
        self.events: list[RecoveryEvent] = []
        self.made: list[DurableWorkspace] = []

    def attempt(self) -> DurableWorkspace:
        ws = DurableWorkspace(
            self.state,
            workspace=self.work if self.pinned else None,
            mode=self.mode,
            on_recovery=self.events.append,
        )
        self.made.append(ws)
        return ws

    def call(
        self,
        tool: str,
        args: dict[str, Any],
        call_id: str,
        held: Iterable[str] = (),
        *,
        thread: str = "t1",
        complete: bool = True,
        ws: DurableWorkspace | None = None,
    ) -> ToolResult:
        known = Knowledge(frozenset(held), complete)
        ws = ws or self.made[-1]
        return ws.run_sync(FrameworkCall(tool, args, thread, call_id, known))

    def log(self) -> list[str]:
        path = self.work / "log.txt"
        return path.read_text().split() if path.exists() else []

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def close(self) -> None:
        for ws in self.made:
            ws.close()
        delete_spaces(self.state / "spaces")


@contextmanager
def attempts(root: Path, mode: Mode = "auto", pinned: bool = True) -> Iterator[Attempts]:
    a = Attempts(root, mode, pinned)
    try:
        yield a
    finally:
        a.close()


def append(word: str) -> dict[str, str]:
    """A bash call whose effect, applied twice, shows: a line appended to log.txt."""
    return {"command": f"echo {word} >> log.txt"}


def conversations(state: Path) -> list[tuple[str, str | None, dict[str, Any] | None]]:
    """The log's conversations: (id, parent, ds.thread document), read by a process of
    its own (the attempts' log is open in theirs: a shared read is what SQLite allows)."""
    storage = SqliteStorage(state / "log.sqlite", exclusive=False)
    try:
        h = asyncio.run(Harness.open(storage, models={}, registry=Registry()))
        return [(c.id, c.parent_id, c.document("ds.thread")) for c in h.conversations()]
    finally:
        storage.close()
