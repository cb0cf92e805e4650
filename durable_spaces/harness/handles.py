"""What a harness hands out: a ``Conversation``, a ``Submission`` and how it ``Settled``.

Views over the harness's committed state (``state.LogState``), never copies of it: a
handle read after a commit sees that commit. Changes go through the harness's one
commit path (``Harness.commit``), so they are durable before they are visible.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from durable_spaces.harness.state import AgentConfig, Entry, LogState, Tx


class _Owner(Protocol):
    """What the handles use of the harness that made them (``scheduler.Harness``): a
    protocol, so this module does not import the scheduler that imports it."""

    state: LogState
    _fatal: BaseException | None
    _closed: bool
    _waiters: dict[str, list[asyncio.Future[None]]]

    def _ensure_driver(self, cid: str) -> None: ...

    def _submit(self, cid: str, content: str, request_id: str | None) -> Submission: ...

    def _fork(
        self,
        cid: str,
        entry_id: str,
        agent: AgentConfig | None,
        at_seq: int | None = None,
        more: Callable[[Tx, str], Any] | None = None,
    ) -> Conversation: ...

    def _commit(self, build: Callable[[Tx], Any]) -> Any: ...


class HarnessView(Protocol):
    """What a tool call (``tools.ToolContext.harness``) and the adapter use of a harness:
    its log's identity, its conversations and its one atomic commit
    (``scheduler.Harness`` is one)."""

    @property
    def log_id(self) -> str: ...

    def conversation(self, conversation_id: str) -> Conversation: ...

    def conversations(self) -> list[Conversation]: ...

    async def commit(self, build: Callable[[Tx], Any]) -> Any: ...


@dataclass(frozen=True)
class Settled:
    """How a submission ended: ``answer`` is the final assistant text."""

    status: Literal["done", "failed"]
    answer: str | None = None
    error: str | None = None


class Submission:
    """An admitted input. ``wait()`` returns when it settles (in this process)."""

    def __init__(self, harness: _Owner, sid: str) -> None:
        self._h = harness
        self.id = sid

    def _s(self) -> dict[str, Any]:
        return self._h.state.subs[self.id]

    @property
    def request_id(self) -> str | None:
        return self._s().get("request_id")

    @property
    def conversation_id(self) -> str:
        return str(self._s()["conversation_id"])

    @property
    def status(self) -> str:
        """queued | active | done | failed"""
        return str(self._s()["state"])

    @property
    def settled(self) -> Settled | None:
        s = self._s()
        if s["state"] not in ("done", "failed"):
            return None
        return Settled(s["state"], s.get("answer"), s.get("error"))

    async def wait(self) -> Settled:
        """The outcome; raises the fatal error (stale epoch, halt, permanent failure) that
        stopped the harness instead of returning."""
        while True:
            if (done := self.settled) is not None:
                return done
            if self._h._fatal is not None:
                raise self._h._fatal
            if self._h._closed:
                raise RuntimeError("the harness is closed")
            self._h._ensure_driver(self.conversation_id)
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._h._waiters.setdefault(self.id, []).append(fut)
            await fut

    def __repr__(self) -> str:
        return f"Submission({self.id!r}, request_id={self.request_id!r}, {self.status})"


class Conversation:
    """A view of one conversation in a harness (cheap; holds only the id)."""

    def __init__(self, harness: _Owner, cid: str) -> None:
        self._h = harness
        self.id = cid

    @property
    def parent_id(self) -> str | None:
        return self._h.state.convs[self.id].parent_id

    @property
    def fork_entry_id(self) -> str | None:
        return self._h.state.convs[self.id].fork_entry_id

    @property
    def agent(self) -> AgentConfig:
        return self._h.state.convs[self.id].agent

    def entries(self) -> list[Entry]:
        """Visible entries: the parent's up to the fork entry, then this conversation's."""
        return self._h.state.visible(self.id)

    def document(
        self, name: str, as_of: str | None = None, default: Any = None, *, copy: bool = True
    ) -> Any:
        """Latest value of a document, or (rewindable ones) its value as of entry ``as_of``.
        ``copy=False`` returns the committed value itself, for a reader that will not
        change it (a copy of a large document costs more than reading it)."""
        return self._h.state.document(self.id, name, as_of, default, copy)

    def documents(self) -> list[str]:
        return sorted(self._h.state.convs[self.id].docs)

    def submissions(self) -> list[Submission]:
        return [
            Submission(self._h, s)
            for s, v in self._h.state.subs.items()
            if v["conversation_id"] == self.id
        ]

    async def submit(self, content: str, request_id: str | None = None) -> Submission:
        """Admit user input once per ``request_id`` (the same id again, even after a restart,
        returns the existing submission) and start (or queue) its run."""
        return self._h._submit(self.id, content, request_id)

    async def fork(
        self,
        entry_id: str,
        agent: AgentConfig | None = None,
        *,
        at_seq: int | None = None,
        more: Callable[[Tx, str], Any] | None = None,
    ) -> Conversation:
        """A new conversation seeing this one's entries up to ``entry_id`` and each
        rewindable document as of it (copied into the fork's creation commit). It keeps
        this conversation's agent unless ``agent`` is given. ``at_seq``: the documents
        as of that commit of this conversation instead (at or after the entry's: what
        was committed after the entry and before the next one); ``more(tx, id)`` adds
        ops to the creation commit."""
        return self._h._fork(self.id, entry_id, agent, at_seq, more)

    async def commit(self, build: Callable[[Tx], Any]) -> Any:
        """One atomic commit of app data; returns what ``build`` returned."""
        return self._h._commit(build)

    def __repr__(self) -> str:
        return f"Conversation({self.id!r})"
