"""A framework's threads in the workspace's log, and the Space kept to what each knows.

Each thread of the framework (a LangGraph ``thread_id``, an Agents SDK session, a
pydantic-ai conversation) is a conversation of the log (``attempt.py``), named by a
``ds.thread`` document; its tool calls are that conversation's wrapped calls, by the
framework's own tool call ids. One call goes as follows:

- **Its result in the log**: the call ran to its end in an attempt before and the
  framework runs it again (its own commit of the result was lost, or, under DBOS, it
  re-executes the workflow, whose tools are no steps): the log's result entry is the
  result; the Space is not touched.
- **Else, the Space kept to the framework's knowledge first.** The framework says which
  tool calls its own durable state holds (``Knowledge``: asked for by the model, or with
  a result). A call of the log that it does not hold is one it has forgotten (it resumed
  from an older checkpoint than the call: LangGraph's async durability, a lost tail, a
  model asked again that answered otherwise), yet its effect is in the Space: an
  *orphan*. Then the thread's conversation is forked as of the first orphan's start
  mark (the documents as of that commit: the image or checkpoint the Space had right
  before it, with the changes made outside the calls until then), the orphans' records
  left out, and the Space is brought back to the fork's log (``DurableSpaces.bring_back``:
  the image, or the newest checkpoint, a ``log_behind`` event saying why). The forgotten
  calls stay in the parent conversation's log (records, images, checkpoints): nothing is
  lost, and ``adapter/review.py`` reads them there. A crash between the fork and the
  Space brought back is found again: the fork's ``ds.thread`` says ``behind`` until then.
- **Then the adapter's pipeline** (``adapter/calls.py``): a call the log has never seen
  runs; one it has (cut off by a crash) is recovered by the recovery table (adopted,
  reattached, replayed, or undone and run again); its result entry is committed, with
  what the adapter adds to it, before the framework hears of it.

Why call ids and not a record of the adapter's in the framework's state: every
framework commits the tool call ids it knows in its own commits already (a ToolMessage,
a session item, a recorded model response), each id names the log's record of its call
(and the image or checkpoint after it), and nothing is added to what the model is shown
or to a framework's state schema. Why a fork and not an image rewritten in place: the
log's image is a chain of versions written once and read back by version
(``adapter/image_log.py``); a fork writes its own versions beside its parent's, which
stay readable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from durable_spaces.adapter import space_state as state_doc
from durable_spaces.adapter.durable import DurableSpaces
from durable_spaces.adapter.recovery import RecoveryEvent
from durable_spaces.adapter.tool_args import check_call_key
from durable_spaces.errors import ConfigError, ToolArgumentError
from durable_spaces.harness.scheduler import Harness
from durable_spaces.harness.state import AgentConfig, Tx
from durable_spaces.harness.tool_tasks import record_result
from durable_spaces.harness.tools import ToolContext, ToolResult

THREAD_DOC = "ds.thread"
START_ENTRY = "ds.thread_start"
#: What a result entry's status may be (anything else read back is an error).
STATUSES = ("ok", "error", "interrupted")
#: The conversations' agent: the framework's, which this log does not run.
FRAMEWORK = AgentConfig(model="framework")


@dataclass(frozen=True)
class Knowledge:
    """The tool calls a framework's durable state holds when it runs one: ``calls``, the
    ids of every call it mentions (the model asked for it, or it has a result). With
    ``complete`` False, the framework commits a turn's calls only after they ran (the
    Agents SDK's session): the calls this process ran or adopted count as held too."""

    calls: frozenset[str]
    complete: bool = True


@dataclass(frozen=True)
class FrameworkCall:
    """One call a framework asks for: its tool (bash, write or edit), its arguments as
    the model sent them, its thread and id, and what the framework holds."""

    tool: str
    args: Any
    thread: str
    call_id: str
    known: Knowledge


class Threads:
    """The threads of one attempt's log (``WorkspaceAttempt.harness``)."""

    def __init__(
        self,
        harness: Harness,
        durable: DurableSpaces,
        space_of: Callable[[str], str],
        one_thread: bool = False,
    ) -> None:
        self.harness = harness
        self.durable = durable
        self.space_of = space_of  # thread -> Space name
        self.one_thread = one_thread  # one Space for every thread: only one may use it
        self._current: dict[str, str] = {}
        self._results: dict[str, dict[str, dict[str, Any]]] = {}  # conv -> call -> result
        self._ran: set[tuple[str, str]] = set()  # (thread, call) this attempt ran or adopted
        self._locks: dict[str, asyncio.Lock] = {}

    # --- a call ---------------------------------------------------------------------------

    async def run(self, call: FrameworkCall) -> ToolResult:
        """The call's result (module docstring), one call of a thread at a time (a
        framework may run a message's calls at once: they would take the Space's lock in
        turn anyway, and must not both fork the thread)."""
        try:
            check_call_key(f"{call.thread}:{call.call_id}")
        except ToolArgumentError as e:
            return ToolResult.error(f"{call.tool}: {e}")  # nothing touched
        async with self._locks.setdefault(call.thread, asyncio.Lock()):
            return await self._run(call)

    async def _run(self, call: FrameworkCall) -> ToolResult:
        conv = await self.conversation(call.thread)
        found = self.results(conv).get(call.call_id)
        self._ran.add((call.thread, call.call_id))
        if found is not None:
            self._adopted(conv, call)
            status = found.get("status")
            details = found.get("details")
            return ToolResult(
                str(found.get("content", "")),
                status if status in STATUSES else "error",
                details if isinstance(details, dict) else {},
            )
        orphans = self.orphans(conv, call)
        if orphans:
            conv = await self._fork_before(conv, call.thread, orphans)
        tool = self.harness.registry.get(call.tool)
        assert tool is not None, call.tool
        state = state_doc.load(self.harness, conv)
        ctx = ToolContext(
            harness=self.harness,
            conversation_id=conv,
            call_id=call.call_id,
            tool_name=call.tool,
            task_id=call.call_id,
            attempt=1,
            resumed=call.call_id in state.calls,
            env=await self.harness.env(conv),
            call_key=f"{call.thread}:{call.call_id}",
        )
        result = await tool.execute(call.args, ctx)
        await record_result(self.harness, ctx, result)
        self.results(conv)[call.call_id] = {
            "content": result.content,
            "status": result.status,
            "details": result.details,
        }
        return result

    def _adopted(self, conv: str, call: FrameworkCall) -> None:
        mode = state_doc.load(self.harness, conv).mode or self.durable.mode
        ev = RecoveryEvent("adopted", mode, call.call_id, conv, {"tool": call.tool, "from": "log"})
        self.durable.parts.events.append(ev)
        if self.durable.config.on_recovery is not None:
            self.durable.config.on_recovery(ev)

    # --- threads and their conversations ------------------------------------------------------

    def current(self, thread: str) -> str | None:
        """The thread's conversation now: the newest that names it."""
        if thread not in self._current:
            for c in self.harness.conversations():
                doc = c.document(THREAD_DOC, copy=False)
                if isinstance(doc, dict) and doc.get("thread") == thread:
                    self._current[thread] = c.id
        return self._current.get(thread)

    def _of_thread(self, thread: str) -> frozenset[str]:
        """Every conversation of the log that names the thread: the thread's Space is
        the thread's, and its current conversation takes over another's claim on it
        (``adapter/space_owner.py``: a Space is claimed by one conversation of a log)."""
        return frozenset(
            c.id
            for c in self.harness.conversations()
            if (doc := c.document(THREAD_DOC, copy=False)) is not None
            and isinstance(doc, dict)
            and doc.get("thread") == thread
        )

    async def conversation(self, thread: str) -> str:
        """The thread's conversation, made on its first call, bound to its Space, and its
        Space brought back first if a fork left it behind (module docstring)."""
        conv = self.current(thread)
        if conv is None and self.one_thread:
            for c in self.harness.conversations():
                doc = c.document(THREAD_DOC, copy=False)
                if isinstance(doc, dict) and doc.get("thread") != thread:
                    raise ConfigError(
                        f"this workspace is thread {str(doc.get('thread'))[:80]!r}'s: thread "
                        f"{thread[:80]!r} needs a workspace of its own (one directory "
                        "cannot be kept for two threads; leave workspace= unset for a "
                        "Space per thread)"
                    )
        if conv is None:

            def named(tx: Tx, cid: str) -> None:
                tx.put_document(cid, THREAD_DOC, {"thread": thread})
                tx.entry(cid, START_ENTRY, {"thread": thread})  # a fork's earliest point

            conv = (await self.harness.create(FRAMEWORK, named)).id
            self._current[thread] = conv
        self.durable.bind(conv, self.space_of(thread), self._of_thread(thread) - {conv})
        doc = self.harness.conversation(conv).document(THREAD_DOC)
        behind = doc.get("behind") if isinstance(doc, dict) else None
        if isinstance(behind, str):
            await self.durable.bring_back(self.harness, conv, behind)
            await self.harness.commit(
                lambda tx: tx.put_document(conv, THREAD_DOC, {"thread": thread})
            )
        return conv

    def results(self, conv: str) -> dict[str, dict[str, Any]]:
        """The conversation's result entries (its own and inherited), by call id."""
        if conv not in self._results:
            self._results[conv] = {
                str(e.data.get("call_id")): e.data
                for e in self.harness.conversation(conv).entries()
                if e.kind == "tool_result"
            }
        return self._results[conv]

    # --- orphans ------------------------------------------------------------------------------

    def orphans(self, conv: str, call: FrameworkCall) -> list[str]:
        """The log's calls of the thread after the last one the framework holds (module
        docstring), the call itself aside. Only after it: a framework may drop old calls
        from what it holds (a trimmed message history) but never hold a call without the
        ones before it, which it committed first."""
        results = self.results(conv)
        in_flight = state_doc.load(self.harness, conv).calls
        logged = [*results, *(c for c in in_flight if c not in results)]
        last = -1
        for i, c in enumerate(logged):
            held = c in call.known.calls or (
                not call.known.complete and (call.thread, c) in self._ran
            )
            if held or c == call.call_id:
                last = i
        return [c for c in logged[last + 1 :] if c != call.call_id]

    def _start_of(self, conv: str, call_id: str) -> tuple[str, int] | None:
        """The conversation (``conv`` or an ancestor) and the commit of ``call_id``'s first
        start mark: the first version of a ``cua.space`` document holding its record, a
        fork's copies at its creation aside."""
        chain: list[str] = []
        cid: str | None = conv
        while cid is not None:
            chain.append(cid)
            cid = self.harness.conversation(cid).parent_id
        for cid in reversed(chain):
            c = self.harness.state.convs[cid]
            doc = c.docs.get(state_doc.DOC)
            for seq, value in doc.versions if doc is not None else ():
                copied = c.parent_id is not None and seq == c.seq
                if not copied and call_id in ((value or {}).get("calls") or {}):
                    return cid, seq
        return None

    async def _fork_before(self, conv: str, thread: str, orphans: list[str]) -> str:
        """Fork the thread's conversation as of the first orphan's start mark and bring
        the Space back to it; the fork is the thread's conversation from then on."""
        starts = [s for o in orphans if (s := self._start_of(conv, o)) is not None]
        if not starts:  # only result entries, no record: nothing to fork at (a damaged log)
            return conv
        source, seq = min(starts, key=lambda s: s[1])
        at = [e for e in self.harness.conversation(source).entries() if e.seq < seq][-1]
        reason = f"the framework does not hold the calls {orphans[:8]} that the Space has"
        state = state_doc.SpaceState.from_json(
            self.harness.state.documents_at(source, seq).get(state_doc.DOC)
        )
        for o in orphans:
            state.calls.pop(o, None)

        def more(tx: Tx, fid: str) -> None:
            state_doc.put(tx, fid, state)  # the orphans' records left out
            tx.put_document(fid, THREAD_DOC, {"thread": thread, "behind": reason})

        fork = (await self.harness.conversation(source).fork(at.id, at_seq=seq, more=more)).id
        self._current[thread] = fork
        return await self.conversation(thread)
