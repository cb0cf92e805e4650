"""The minimal durable agent harness: conversations, entries, documents and tasks on a log.

Modeled on Pi Durable's rules (see ../shared/reference), in Python's terms:

- Every mutation is ONE ``storage.append(ops)``; the in-memory state (``LogState``, in
  ``state.py``; this module is the scheduler over it, ``handles.py`` the views it hands
  out, ``tool_tasks.py`` how a tool call runs) is only ever changed by
  replaying committed ops, on open and right after each append returns. So the
  state a reader sees is always a prefix of the log, and a crash loses at most the commit in
  flight. Build + append + apply run without an ``await`` in between, which is what keeps
  ids and ordering consistent in one event loop (no lock needed).
- A submission admits its user entry and its first generation task in one commit; the
  assistant entry and its tool tasks' intent (``pending``) in the next; a tool task is
  committed ``running`` (with its attempt) before ``execute()``; its result entry and its
  ``done`` state are one commit, which also admits the next generation task after the last
  tool of a message. The driver decides each step from committed state alone, so
  ``resume()`` in a new process continues exactly where the log stops.
- After a crash: a generation task is simply asked again; a tool task found ``running`` is
  rerun if ``replay == "safe"`` and otherwise ends ``interrupted`` with the output committed
  so far; a ``pending`` one just runs.
- ``StaleEpochError``, ``HaltError`` and ``PermanentFailure`` are never recorded: they stop
  the harness and surface from ``Submission.wait()``.

Rejected: an ORM of tables (the storage stays a dumb line of JSON commits, one SQL module),
and threads (one asyncio loop drives every conversation; tools await their own I/O).
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import PermanentFailure
from durable_spaces.harness.env import ExecutionEnv, LocalDirEnv
from durable_spaces.harness.handles import Conversation, Settled, Submission
from durable_spaces.harness.log import LogOp, Storage
from durable_spaces.harness.log_core import encoded
from durable_spaces.harness.models import Model
from durable_spaces.harness.state import AgentConfig, Entry, LogState, Tx
from durable_spaces.harness.tool_tasks import FATAL, run_tool, tools_for
from durable_spaces.harness.tools import Registry

EnvFactory = Callable[[str], Awaitable[ExecutionEnv]]


class Harness:
    """Durable conversations over a ``Storage``. Create with ``await Harness.open(...)``."""

    @property
    def last_seq(self) -> int:
        """The seq of the newest commit applied."""
        return self.state.last_seq

    @property
    def log_id(self) -> str:
        """The identity of the log this harness runs on (``Storage.identity``; "" for a
        storage that has none)."""
        return str(getattr(self.storage, "identity", "") or "")

    def __init__(
        self,
        storage: Storage,
        models: Mapping[str, Model],
        registry: Registry,
        env: EnvFactory | None,
    ) -> None:
        self.storage = storage
        self.models = dict(models)
        self.registry = registry
        self._env_factory = env or _local_env_factory(os.getcwd())
        self._envs: dict[str, ExecutionEnv] = {}
        self.state = LogState()
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._drivers: dict[str, asyncio.Task[None]] = {}
        self._fatal: BaseException | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        storage: Storage,
        *,
        models: Mapping[str, Model],
        registry: Registry,
        env: EnvFactory | None = None,
    ) -> Harness:
        """Rebuild the state by replaying every stored commit. Nothing runs until
        ``resume()`` or a ``submit()``."""
        h = cls(storage, models, registry, env)
        for c in storage.load():
            h._apply(c.seq, c.ops)
        registry.opened(h)
        return h

    # -- public reading API ---------------------------------------------------------------

    async def root(self, agent: AgentConfig | None = None) -> Conversation:
        """The root conversation, created (with ``agent``) on first call only."""
        for c in self.state.convs.values():
            if c.parent_id is None:
                return Conversation(self, c.id)
        if agent is None:
            raise ValueError("the first call of root() needs an agent")
        cid = self._commit(lambda tx: tx._conversation(agent))
        return Conversation(self, cid)

    async def create(
        self, agent: AgentConfig, build: Callable[[Tx, str], Any] | None = None
    ) -> Conversation:
        """A new root conversation (``root()`` makes the first); ``build(tx, id)`` adds
        ops to its creation commit, so what names it is committed with it."""

        def create(tx: Tx) -> str:
            cid = tx._conversation(agent)
            if build is not None:
                build(tx, cid)
            return cid

        return Conversation(self, self._commit(create))

    def conversation(self, conversation_id: str) -> Conversation:
        if conversation_id not in self.state.convs:
            raise KeyError(f"no conversation {conversation_id!r}")
        return Conversation(self, conversation_id)

    def conversations(self) -> list[Conversation]:
        return [Conversation(self, c) for c in self.state.convs]

    def entry(self, entry_id: str) -> Entry:
        return self.state.entries[entry_id]

    def submission(self, submission_id: str) -> Submission:
        if submission_id not in self.state.subs:
            raise KeyError(f"no submission {submission_id!r}")
        return Submission(self, submission_id)

    def tasks(self, conversation_id: str | None = None) -> list[dict[str, Any]]:
        """Committed task states (copies), in creation order."""
        return [
            copy.deepcopy(t)
            for t in self.state.tasks.values()
            if conversation_id is None or t["conversation_id"] == conversation_id
        ]

    @property
    def aborted(self) -> BaseException | None:
        """The fatal error that stopped this harness, if any."""
        return self._fatal

    async def env(self, conversation_id: str) -> ExecutionEnv:
        """The conversation's execution environment (made once per process)."""
        if conversation_id not in self._envs:
            self._envs[conversation_id] = await self._env_factory(conversation_id)
        return self._envs[conversation_id]

    async def commit(self, build: Callable[[Tx], Any]) -> Any:
        """One atomic commit; returns what ``build`` returned."""
        return self._commit(build)

    # -- scheduling -----------------------------------------------------------------------

    def resume(self) -> None:
        """Schedule every unfinished submission from its committed state (background
        asyncio tasks; one driver per conversation, submissions in admission order)."""
        for s in self.state.subs.values():
            if s["state"] in ("queued", "active"):
                self._ensure_driver(s["conversation_id"])

    async def settled(self) -> None:
        """Wait until no conversation has work left; raises the fatal error if one stopped
        the harness."""
        while pending := [t for t in self._drivers.values() if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._fatal is not None:
            raise self._fatal

    async def close(self) -> None:
        """Stop driving (a tool cut off here is found ``running`` by the next process).
        The storage stays open: whoever opened it closes it."""
        self._closed = True
        tasks = [t for t in self._drivers.values() if not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for futs in self._waiters.values():
            for fut in futs:
                fut.cancel()
        self._waiters.clear()

    def _ensure_driver(self, cid: str) -> None:
        if self._fatal is not None or self._closed:
            return
        t = self._drivers.get(cid)
        if t is None or t.done():
            self._drivers[cid] = asyncio.get_running_loop().create_task(
                self._drive(cid), name=f"harness-driver-{cid}"
            )

    def _abort(self, exc: BaseException) -> None:
        """Stop everything without recording anything; every waiter sees ``exc``."""
        if self._fatal is None:
            self._fatal = exc
        for futs in self._waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(self._fatal)
        self._waiters.clear()
        current = asyncio.current_task()
        for t in self._drivers.values():
            if t is not current and not t.done():
                t.cancel()

    # -- committing -----------------------------------------------------------------------

    def _commit(self, build: Callable[[Tx], Any]) -> Any:
        if self._fatal is not None:
            raise self._fatal
        tx = Tx(self.state)
        result = build(tx)
        if tx.ops:
            ops = encoded(tx.ops)  # what a storage stores: plain JSON (and its text)
            try:
                seq = self.storage.append(ops)
            except FATAL as e:
                self._abort(e)
                raise
            self._apply(seq, ops)
        return result

    def _apply(self, seq: int, ops: list[LogOp]) -> None:
        """Materialize one committed commit; wake the waiters of what it settled."""
        for sid in self.state.apply(seq, ops):
            for fut in self._waiters.pop(sid, []):
                if not fut.done():
                    fut.set_result(None)

    # -- admitting and forking ------------------------------------------------------------

    def _submit(self, cid: str, content: str, request_id: str | None) -> Submission:
        if cid not in self.state.convs:
            raise KeyError(f"no conversation {cid!r}")
        if request_id is not None and request_id in self.state.requests:
            sub = Submission(self, self.state.requests[request_id])
            if sub.conversation_id != cid:
                raise ValueError(f"request_id {request_id!r} belongs to another conversation")
            self._ensure_driver(cid)
            return sub
        busy = any(
            s["conversation_id"] == cid and s["state"] in ("queued", "active")
            for s in self.state.subs.values()
        )

        def build(tx: Tx) -> str:
            sid = tx._id("s")
            fields = {"conversation_id": cid, "request_id": request_id, "content": content}
            if busy:  # runs after the current one; admitted as input when it starts
                tx._submission(sid, state="queued", **fields)
            else:
                eid = self._start_ops(tx, sid, cid, content)
                tx._submission(sid, state="active", entry_id=eid, **fields)
            return sid

        sid = self._commit(build)
        hit("harness.admit")
        self._ensure_driver(cid)
        return Submission(self, sid)

    def _start_ops(self, tx: Tx, sid: str, cid: str, content: str) -> str:
        """The user entry and the first generation task (one commit with the submission)."""
        eid = tx.entry(cid, "user", {"content": content})
        tx._task(kind="generation", conversation_id=cid, submission_id=sid, state="pending")
        return eid

    def _fork(
        self,
        cid: str,
        entry_id: str,
        agent: AgentConfig | None,
        at_seq: int | None = None,
        more: Callable[[Tx, str], Any] | None = None,
    ) -> Conversation:
        entry = self.state.entries.get(entry_id)
        if entry is None or not self.state.is_visible(cid, entry):
            raise KeyError(f"entry {entry_id!r} is not visible in conversation {cid!r}")
        if at_seq is None:
            docs = {
                n: self.state.document(cid, n, entry_id, None)
                for n in self.state.rewindable_at(cid, entry)
            }
        elif entry.seq <= at_seq <= self.state.last_seq and at_seq >= self.state.convs[cid].seq:
            docs = self.state.documents_at(cid, at_seq)
        else:
            raise ValueError(
                f"commit {at_seq} is not in conversation {cid!r} at or after entry {entry_id!r}"
            )
        config = agent or self.state.convs[cid].agent

        def build(tx: Tx) -> str:
            fid = tx._conversation(config, cid, entry_id)
            for name, value in docs.items():
                tx.put_document(fid, name, value, rewindable=True)
            if more is not None:
                more(tx, fid)
            return fid

        return Conversation(self, self._commit(build))

    # -- driving --------------------------------------------------------------------------

    async def _drive(self, cid: str) -> None:
        try:
            while (sid := self._next_submission(cid)) is not None:
                await self._step(sid)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # fatal by contract, or a bug: stop, record nothing
            self._abort(e)

    def _next_submission(self, cid: str) -> str | None:
        for sid, s in self.state.subs.items():
            if s["conversation_id"] == cid and s["state"] in ("queued", "active"):
                return sid
        return None

    def _sub_tasks(self, sid: str, kind: str) -> list[dict[str, Any]]:
        return [
            t for t in self.state.tasks.values() if t["submission_id"] == sid and t["kind"] == kind
        ]

    async def _step(self, sid: str) -> None:
        """One committed step of a submission, chosen from committed state only."""
        s = self.state.subs[sid]
        cid = s["conversation_id"]
        if s["state"] == "queued":

            def start(tx: Tx) -> None:
                eid = self._start_ops(tx, sid, cid, s["content"])
                tx._submission(sid, state="active", entry_id=eid)

            self._commit(start)
            hit("harness.admit")
            return
        gens = self._sub_tasks(sid, "generation")
        for g in gens:
            if g["state"] != "done":
                await self._generate(s, g, turn=len(gens))
                return
        for t in self._sub_tasks(sid, "tool"):
            if t["state"] != "done":
                await run_tool(self, t)
                return
        # Nothing in flight yet unsettled (cannot happen with this harness's commits):
        # ask the model again rather than hang.
        self._commit(
            lambda tx: tx._task(
                kind="generation", conversation_id=cid, submission_id=sid, state="pending"
            )
        )

    def _settle_ops(
        self, tx: Tx, sid: str, status: str, answer: str | None, error: str | None
    ) -> None:
        tx._submission(sid, state=status, answer=answer, error=error)

    async def _generate(self, s: dict[str, Any], gen: dict[str, Any], turn: int) -> None:
        cid, sid = s["conversation_id"], gen["submission_id"]
        agent = self.state.convs[cid].agent
        model = self.models.get(agent.model)
        error: str | None = None
        if model is None:  # a setup error of this process, not an outcome to record
            raise PermanentFailure(
                f"no model named {agent.model!r} (models: {sorted(self.models)})"
            )
        if agent.max_turns is not None and turn > agent.max_turns:
            error = f"more than {agent.max_turns} model requests"
        if error is None:
            try:
                msg = await model.generate(
                    self.state.visible(cid), tools_for(self, agent), agent.system
                )
            except FATAL:
                raise
            except Exception as e:
                error = f"model request failed: {type(e).__name__}: {e}"
        if error is not None:

            def failed(tx: Tx) -> None:
                tx._task(gen["id"], state="done", failed=True)
                self._settle_ops(tx, sid, "failed", None, error)

            self._commit(failed)
            return
        hit("harness.generated")

        def answered(tx: Tx) -> None:
            calls = [tc.to_json() for tc in msg.tool_calls]
            eid = tx.entry(cid, "assistant", {"content": msg.content, "tool_calls": calls})
            tx._task(gen["id"], state="done", entry_id=eid)
            for i, tc in enumerate(msg.tool_calls):
                tx._task(
                    kind="tool",
                    conversation_id=cid,
                    submission_id=sid,
                    generation_id=gen["id"],
                    index=i,
                    call_id=tc.id,
                    name=tc.name,
                    args=tc.args,
                    state="pending",
                    attempt=0,
                    output="",
                )
            if not msg.tool_calls:
                self._settle_ops(tx, sid, "done", msg.content, None)

        self._commit(answered)
        hit("harness.intent" if msg.tool_calls else "harness.answer")


def _local_env_factory(root: str) -> EnvFactory:
    async def factory(conversation_id: str) -> ExecutionEnv:
        return LocalDirEnv(root)

    return factory


__all__ = [
    "FATAL",
    "AgentConfig",
    "Conversation",
    "Entry",
    "Harness",
    "Settled",
    "Submission",
    "Tx",
]
