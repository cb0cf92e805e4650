"""The raw commits as a transcript: the root conversation's entries, calls and documents.

Op shapes (as ``durable_spaces/harness/state.py`` writes them): ``{"op":
"conversation", "id", "parent_id"}``, ``{"op": "entry", "id", "conversation_id", "kind",
"data"}`` (an ``assistant`` entry's ``data.tool_calls`` are ``{"id", "name", "args"}``;
a ``tool_result``'s data has ``call_id`` and ``status``), ``{"op": "doc",
"conversation_id", "name", "value"}``, ``{"op": "submission", "state"}``. Only the root
conversation (the first without a parent) is the campaign's; forks are not read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from durable_spaces.campaigns.checks.rawlog import RawCommit, RawLog

SPACE_DOC = "cua.space"


@dataclass(frozen=True)
class HistoryEntry:
    seq: int  # the commit that holds it
    id: str
    kind: str
    data: dict[str, Any]


@dataclass
class History:
    """What the log committed, decoded for checking."""

    commits: list[RawCommit]
    conversation: str | None = None
    entries: list[HistoryEntry] = field(default_factory=list)
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)  # call id -> tool call
    call_seq: dict[str, int] = field(default_factory=dict)  # call id -> its assistant commit
    results: list[dict[str, Any]] = field(default_factory=list)  # tool_result data, in order
    result_seq: dict[str, int] = field(default_factory=dict)  # call id -> its result commit
    docs: dict[str, Any] = field(default_factory=dict)  # latest value per doc name (root)
    doc_seq: dict[str, int] = field(default_factory=dict)  # doc name -> its latest commit
    torn_tail: str | None = None

    @staticmethod
    def from_commits(commits: list[RawCommit], torn_tail: str | None = None) -> History:
        h = History(list(commits), torn_tail=torn_tail)
        for c in commits:
            for op in c.ops:
                h._add(c.seq, op)
        return h

    @staticmethod
    def from_log(log: RawLog) -> History:
        return History.from_commits(log.commits, log.torn_tail)

    def _add(self, seq: int, op: dict[str, Any]) -> None:
        kind = op.get("op")
        if kind == "conversation" and op.get("parent_id") is None and self.conversation is None:
            self.conversation = str(op.get("id"))
            return
        if op.get("conversation_id") != self.conversation or self.conversation is None:
            return
        if kind == "entry":
            raw = op.get("data")
            data: dict[str, Any] = raw if isinstance(raw, dict) else {}
            e = HistoryEntry(seq, str(op.get("id")), str(op.get("kind")), data)
            self.entries.append(e)
            if e.kind == "assistant":
                for tc in data.get("tool_calls") or []:
                    if isinstance(tc, dict) and isinstance(tc.get("id"), str):
                        self.calls.setdefault(tc["id"], tc)
                        self.call_seq.setdefault(tc["id"], seq)
            elif e.kind == "tool_result":
                self.results.append(data)
                self.result_seq.setdefault(str(data.get("call_id")), seq)
        elif kind == "doc" and isinstance(op.get("name"), str):
            self.docs[op["name"]] = op.get("value")
            self.doc_seq[op["name"]] = seq

    def doc_values(self, name: str) -> Iterator[Any]:
        """Every value the root conversation's document ``name`` ever had, in order."""
        for c in self.commits:
            for op in c.ops:
                if (
                    op.get("op") == "doc"
                    and op.get("name") == name
                    and op.get("conversation_id") == self.conversation
                ):
                    yield op.get("value")

    def instances(self) -> set[str]:
        """Every Space instance the adapter ever recorded (a Space placed again is a new
        instance; processes of any of them belong to this run)."""
        out: set[str] = set()
        for v in self.doc_values(SPACE_DOC):
            if not isinstance(v, dict):
                continue
            if isinstance(v.get("instance"), str):
                out.add(v["instance"])
            for rec in (v.get("calls") or {}).values():
                if isinstance(rec, dict) and isinstance(rec.get("instance"), str):
                    out.add(rec["instance"])
        return out
