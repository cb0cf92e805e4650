"""What the committed log implies: conversations, entries, documents, submissions, tasks.

``LogState.apply`` is the only writer: the harness replays every stored commit through it
on open and each new commit right after its append returns, so what a reader sees is
always a prefix of the log. ``Tx`` builds one commit's ops against it (ids are allocated
from its counters, so they are in the log). The harness's scheduling lives elsewhere
(``adapter.harness``); this module knows nothing of models, tools or asyncio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_spaces.harness.log import LogOp


def json_copy(value: Any) -> Any:
    """A copy of a JSON value (what a document holds: it went through the log's JSON),
    sharing only immutable leaves, so cheaper than ``copy.deepcopy``, which a call paid
    several times for each document it read."""
    t = type(value)
    if t is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if t is list or t is tuple:
        return t(json_copy(v) for v in value)
    return value


@dataclass(frozen=True)
class Entry:
    """An immutable transcript entry, with the seq of the commit that stored it."""

    id: str
    conversation_id: str
    kind: str
    data: dict[str, Any]
    seq: int


@dataclass(frozen=True)
class AgentConfig:
    """Which model (a key of ``Harness.open(models=...)``) answers, with what system prompt
    and which tools (None: every registered tool). ``max_turns`` bounds model requests per
    submission (None: unbounded)."""

    model: str
    system: str | None = None
    tools: list[str] | None = None
    max_turns: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "system": self.system,
            "tools": self.tools,
            "max_turns": self.max_turns,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AgentConfig:
        return cls(d["model"], d.get("system"), d.get("tools"), d.get("max_turns"))


@dataclass
class Doc:
    rewindable: bool
    versions: list[tuple[int, Any]]  # (commit seq, value); only the last for `latest` docs


@dataclass
class ConvState:
    id: str
    parent_id: str | None
    fork_entry_id: str | None
    agent: AgentConfig
    seq: int
    entries: list[Entry] = field(default_factory=list)
    docs: dict[str, Doc] = field(default_factory=dict)


class Tx:
    """One atomic commit being built. Ids are allocated here, so they are in the log."""

    def __init__(self, state: LogState) -> None:
        self._state = state
        self.ops: list[LogOp] = []
        self._next = dict(state.counters)
        self._new_convs: set[str] = set()

    def _id(self, prefix: str) -> str:
        self._next[prefix] = self._next.get(prefix, 0) + 1
        return f"{prefix}{self._next[prefix]}"

    def _check_conv(self, conversation_id: str) -> None:
        if conversation_id not in self._state.convs and conversation_id not in self._new_convs:
            raise KeyError(f"no conversation {conversation_id!r}")

    def entry(self, conversation_id: str, kind: str, data: dict[str, Any]) -> str:
        """Append an entry of ``kind`` (yours or a built-in one); returns its id."""
        self._check_conv(conversation_id)
        eid = self._id("e")
        self.ops.append(
            {
                "op": "entry",
                "id": eid,
                "conversation_id": conversation_id,
                "kind": kind,
                "data": data,
            }
        )
        return eid

    def put_document(
        self, conversation_id: str, name: str, value: Any, rewindable: bool = False
    ) -> None:
        """Set a JSON document; a rewindable one keeps every version (readable as of an
        entry, copied as of the fork entry into a fork)."""
        self._check_conv(conversation_id)
        self.ops.append(
            {
                "op": "doc",
                "conversation_id": conversation_id,
                "name": name,
                "value": value,
                "rewindable": rewindable,
            }
        )

    # -- internal ops ---------------------------------------------------------------------

    def _conversation(
        self, agent: AgentConfig, parent_id: str | None = None, fork_entry_id: str | None = None
    ) -> str:
        cid = self._id("c")
        self._new_convs.add(cid)
        self.ops.append(
            {
                "op": "conversation",
                "id": cid,
                "parent_id": parent_id,
                "fork_entry_id": fork_entry_id,
                "agent": agent.to_json(),
            }
        )
        return cid

    def _task(self, task_id: str | None = None, **fields: Any) -> str:
        tid = task_id or self._id("t")
        self.ops.append({"op": "task", "id": tid, **fields})
        return tid

    def _submission(self, sid: str, **fields: Any) -> None:
        self.ops.append({"op": "submission", "id": sid, **fields})


class LogState:
    """The materialized log: every dict here is changed only by ``apply``."""

    def __init__(self) -> None:
        self.convs: dict[str, ConvState] = {}
        self.entries: dict[str, Entry] = {}
        self.order: dict[str, int] = {}  # entry id -> position in the log
        self.subs: dict[str, dict[str, Any]] = {}
        self.requests: dict[str, str] = {}  # request id -> submission id
        self.tasks: dict[str, dict[str, Any]] = {}
        self.counters: dict[str, int] = {}  # id prefix -> highest number committed
        self.last_seq = 0

    def apply(self, seq: int, ops: list[LogOp]) -> list[str]:
        """Materialize one committed commit (on open and after each append); returns the
        submissions it settled."""
        self.last_seq = max(self.last_seq, seq)
        settled: list[str] = []
        for op in ops:
            kind = op["op"]
            if kind == "conversation":
                self.convs[op["id"]] = ConvState(
                    op["id"],
                    op.get("parent_id"),
                    op.get("fork_entry_id"),
                    AgentConfig.from_json(op["agent"]),
                    seq,
                )
            elif kind == "entry":
                e = Entry(op["id"], op["conversation_id"], op["kind"], op["data"], seq)
                self.convs[e.conversation_id].entries.append(e)
                self.entries[e.id] = e
                self.order[e.id] = len(self.order)
            elif kind == "doc":
                docs = self.convs[op["conversation_id"]].docs
                doc = docs.setdefault(op["name"], Doc(bool(op["rewindable"]), []))
                doc.rewindable = bool(op["rewindable"])
                if doc.rewindable:
                    doc.versions.append((seq, op["value"]))
                else:
                    doc.versions = [(seq, op["value"])]
            elif kind == "submission":
                fields = {k: v for k, v in op.items() if k != "op"}
                s = self.subs.setdefault(op["id"], {})
                s.update(fields)
                if s.get("request_id") is not None:
                    self.requests[s["request_id"]] = op["id"]
                if s.get("state") in ("done", "failed"):
                    settled.append(op["id"])
            elif kind == "task":
                self.tasks.setdefault(op["id"], {}).update(
                    {k: v for k, v in op.items() if k != "op"}
                )
            else:
                raise ValueError(f"unknown op {kind!r} in commit {seq}")
            oid = op.get("id")
            if isinstance(oid, str) and oid[1:].isdigit():
                n = int(oid[1:])
                if n > self.counters.get(oid[0], 0):
                    self.counters[oid[0]] = n
        return settled

    def visible(self, cid: str) -> list[Entry]:
        c = self.convs[cid]
        base: list[Entry] = []
        if c.parent_id is not None:
            parent = self.visible(c.parent_id)
            ids = [e.id for e in parent]
            base = parent[: ids.index(c.fork_entry_id) + 1] if c.fork_entry_id in ids else []
        return base + c.entries

    def is_visible(self, cid: str, entry: Entry) -> bool:
        """Whether ``entry`` is in ``cid``'s visible transcript (without building it)."""
        c = self.convs[cid]
        if entry.conversation_id == cid:
            return True
        if c.parent_id is None or c.fork_entry_id is None:
            return False
        fork_at = self.entries[c.fork_entry_id]
        return self.order[entry.id] <= self.order[fork_at.id] and self.is_visible(
            c.parent_id, entry
        )

    def document(
        self, cid: str, name: str, as_of: str | None, default: Any, copy_value: bool = True
    ) -> Any:
        c = self.convs[cid]
        if as_of is not None:
            entry = self.entries.get(as_of)
            if entry is None or not self.is_visible(cid, entry):
                raise KeyError(f"entry {as_of!r} is not visible in conversation {cid!r}")
            if entry.conversation_id != cid:
                # An entry inherited from the parent: the parent knew the state then.
                assert c.parent_id is not None
                return self.document(c.parent_id, name, as_of, default, copy_value)
        doc = c.docs.get(name)
        if doc is None:
            return default
        versions = doc.versions
        if as_of is not None and doc.rewindable:
            at = self.entries[as_of].seq
            versions = [v for v in versions if v[0] <= at]
        if not versions:
            return default
        return json_copy(versions[-1][1]) if copy_value else versions[-1][1]

    def documents_at(self, cid: str, seq: int) -> dict[str, Any]:
        """Each rewindable document of ``cid`` as of commit ``seq`` (copies): its own
        versions, which a fork holds from its creation on."""
        out: dict[str, Any] = {}
        for name, doc in self.convs[cid].docs.items():
            kept = [v for s, v in doc.versions if s <= seq] if doc.rewindable else []
            if kept:
                out[name] = json_copy(kept[-1])
        return out

    def rewindable_at(self, cid: str, entry: Entry) -> list[str]:
        c = self.convs[cid]
        if entry.conversation_id != cid:
            assert c.parent_id is not None
            return self.rewindable_at(c.parent_id, entry)
        return sorted(
            n
            for n, d in c.docs.items()
            if d.rewindable and any(s <= entry.seq for s, _ in d.versions)
        )
