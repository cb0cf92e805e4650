"""The minimal durable agent harness: conversations, entries, documents and tasks on a log.

Modeled on Pi Durable's rules (see ../shared/reference), in Python's terms:

- Every mutation is ONE ``storage.append(ops)``; the in-memory state (``LogState``, in
  ``adapter.log_state``; this module is the scheduler over it) is only ever changed by
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
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import HaltError, PermanentFailure, StaleEpochError
from durable_spaces.harness.env import ExecutionEnv, LocalDirEnv
from durable_spaces.harness.log import Op, Storage
from durable_spaces.harness.models import Model
from durable_spaces.harness.state import AgentConfig, Entry, LogState, Tx
from durable_spaces.harness.tools import Registry, Tool, ToolContext, ToolResult

#: Errors that stop the harness without recording anything (never a tool result).
FATAL: tuple[type[BaseException], ...] = (StaleEpochError, HaltError, PermanentFailure)

EnvFactory = Callable[[str], Awaitable[ExecutionEnv]]

#: How often live tool output is committed at most, and how much of it is kept.
OUTPUT_FLUSH_SECONDS = 0.2
OUTPUT_KEEP_CHARS = 64 * 1024


@dataclass(frozen=True)
class Settled:
    """How a submission ended: ``answer`` is the final assistant text."""

    status: Literal["done", "failed"]
    answer: str | None = None
    error: str | None = None


class Submission:
    """An admitted input. ``wait()`` returns when it settles (in this process)."""

    def __init__(self, harness: Harness, sid: str) -> None:
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

    def __init__(self, harness: Harness, cid: str) -> None:
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

    def document(self, name: str, as_of: str | None = None, default: Any = None) -> Any:
        """Latest value of a document, or (rewindable ones) its value as of entry ``as_of``."""
        return self._h.state.document(self.id, name, as_of, default)

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

    async def fork(self, entry_id: str, agent: AgentConfig | None = None) -> Conversation:
        """A new conversation seeing this one's entries up to ``entry_id`` and each
        rewindable document as of it (copied into the fork's creation commit). It keeps
        this conversation's agent unless ``agent`` is given."""
        return self._h._fork(self.id, entry_id, agent)

    async def commit(self, build: Callable[[Tx], Any]) -> Any:
        """One atomic commit of app data; returns what ``build`` returned."""
        return self._h._commit(build)

    def __repr__(self) -> str:
        return f"Conversation({self.id!r})"


class Harness:
    """Durable conversations over a ``Storage``. Create with ``await Harness.open(...)``."""

    @property
    def last_seq(self) -> int:
        """The seq of the newest commit applied."""
        return self.state.last_seq

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
            ops = json.loads(json.dumps(tx.ops))  # what a storage stores: plain JSON
            try:
                seq = self.storage.append(ops)
            except FATAL as e:
                self._abort(e)
                raise
            self._apply(seq, ops)
        return result

    def _apply(self, seq: int, ops: list[Op]) -> None:
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

    def _fork(self, cid: str, entry_id: str, agent: AgentConfig | None) -> Conversation:
        entry = self.state.entries.get(entry_id)
        if entry is None or not self.state.is_visible(cid, entry):
            raise KeyError(f"entry {entry_id!r} is not visible in conversation {cid!r}")
        docs = {
            n: self.state.document(cid, n, entry_id, None)
            for n in self.state.rewindable_at(cid, entry)
        }
        config = agent or self.state.convs[cid].agent

        def build(tx: Tx) -> str:
            fid = tx._conversation(config, cid, entry_id)
            for name, value in docs.items():
                tx.put_document(fid, name, value, rewindable=True)
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
                await self._run_tool(t)
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
                    self.state.visible(cid), self._tools_for(agent), agent.system
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

    def _tools_for(self, agent: AgentConfig) -> list[Tool]:
        if agent.tools is None:
            return self.registry.tools()
        return [t for n in agent.tools if (t := self.registry.get(n)) is not None]

    async def _run_tool(self, task: dict[str, Any]) -> None:
        cid, tid = task["conversation_id"], task["id"]
        tool = self.registry.get(task["name"])
        resumed = task["state"] == "running"  # only a crash leaves a task running
        if tool is None:
            self._finish_tool(task, ToolResult.error(f"unknown tool {task['name']!r}"), "")
            return
        if resumed and tool.replay != "safe":
            output = task.get("output", "")
            note = (
                f"The {task['name']} call was interrupted: the process running it stopped "
                "before its result was recorded, and it was not run again (its effects, if "
                "any, are unknown)."
            )
            if output:
                note += f" Output committed before the interruption:\n{output}"
            self._finish_tool(task, ToolResult.interrupted(note), output)
            hit("harness.tool_interrupted")
            return
        env = await self.env(cid)  # before `running`: a refusal here records nothing
        attempt = int(task.get("attempt", 0)) + 1
        self._commit(lambda tx: tx._task(tid, state="running", attempt=attempt))
        hit("harness.tool_running")
        flusher = _OutputFlusher(self, tid)
        ctx = ToolContext(
            harness=self,
            conversation_id=cid,
            call_id=task["call_id"],
            tool_name=task["name"],
            task_id=tid,
            attempt=attempt,
            resumed=resumed,
            env=env,
            committed_output=task.get("output", ""),
            on_output=flusher.add,
        )
        try:
            args = task["args"]  # whatever the model sent: the tool checks it
            result = await tool.execute(dict(args) if isinstance(args, dict) else args, ctx)
            if not isinstance(result, ToolResult):
                result = ToolResult.error(f"tool returned {type(result).__name__}, not ToolResult")
        except FATAL:
            flusher.cancel()
            raise
        except asyncio.CancelledError:
            flusher.cancel()
            raise
        except Exception as e:
            result = ToolResult.error(f"{type(e).__name__}: {e}")
        flusher.cancel()
        hit("harness.tool_returned")
        self._finish_tool(task, result, ctx.output_so_far[-OUTPUT_KEEP_CHARS:], ctx.result_builds)
        hit("harness.tool_result")

    def _finish_tool(
        self,
        task: dict[str, Any],
        result: ToolResult,
        output: str,
        extra: Sequence[Callable[[Tx, str], None]] = (),
    ) -> None:
        """The result entry, the task's end and (after the message's last tool) the next
        generation task: one commit."""
        cid, sid, tid = task["conversation_id"], task["submission_id"], task["id"]
        last = all(
            t["state"] == "done" or t["id"] == tid
            for t in self._sub_tasks(sid, "tool")
            if t["generation_id"] == task["generation_id"]
        )

        def build(tx: Tx) -> None:
            data = {
                "call_id": task["call_id"],
                "name": task["name"],
                "status": result.status,
                "content": result.content,
                "output": output,
                "details": result.details,
            }
            eid = tx.entry(cid, "tool_result", data)
            tx._task(tid, state="done", status=result.status, entry_id=eid, output=output)
            for build_more in extra:
                build_more(tx, eid)
            if last:
                tx._task(kind="generation", conversation_id=cid, submission_id=sid, state="pending")

        self._commit(build)


class _OutputFlusher:
    """Commits a running tool's accumulated output at most every ``OUTPUT_FLUSH_SECONDS``."""

    def __init__(self, harness: Harness, task_id: str) -> None:
        self._h = harness
        self._tid = task_id
        self._parts: list[str] = []
        self._committed = 0
        self._last = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._closed = False

    def add(self, chunk: str) -> None:
        if self._closed:  # output after the call ended belongs to no commit
            return
        self._parts.append(chunk)
        if self._handle is None:
            delay = max(0.0, self._last + OUTPUT_FLUSH_SECONDS - time.monotonic())
            self._handle = asyncio.get_running_loop().call_later(delay, self.flush)

    def flush(self) -> None:
        self._handle = None
        text = "".join(self._parts)
        if len(text) == self._committed or self._h._fatal is not None:
            return
        self._last = time.monotonic()
        try:
            self._h._commit(lambda tx: tx._task(self._tid, output=text[-OUTPUT_KEEP_CHARS:]))
        except BaseException as e:  # _commit already stopped the harness on a fatal error
            self._h._abort(e)
            return
        self._committed = len(text)
        hit("harness.output")

    def cancel(self) -> None:
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


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
