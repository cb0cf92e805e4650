"""The ``cua.space`` document: what the log knows about a conversation's Space.

One rewindable document per conversation (so a fork at an entry reads it as of that
entry). It records the mode and why, the Space instance the log was last consistent
with, and per wrapped call: its start mark (the exec key), its recorded outcome, and
its checkpoint. This is the adapter's bookkeeping; the campaign checker deliberately
does not read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from durable_spaces.adapter.checkpoints.ids import optional
from durable_spaces.errors import BadCheckpointIdError, PermanentFailure
from durable_spaces.harness.state import json_copy

if TYPE_CHECKING:
    from durable_spaces.harness.handles import HarnessView
    from durable_spaces.harness.state import Tx

DOC = "cua.space"
IMAGE_DOC = "cua.space.image"
BLOB_DOC_PREFIX = "cua.blob/"
KEEP_CALLS = 4


@dataclass
class CallRecord:
    """One wrapped call as the log knows it."""

    call_id: str
    tool: str
    order: int
    key: str | None = None  # exec key of the current start mark (bash)
    epoch: int | None = None  # epoch of the start mark
    n: int = 0  # how many start marks this call has had
    mode: str = "checkpoint"
    outcome: dict[str, Any] | None = None  # {"status", "content", "details"}
    checkpoint: str | None = None  # checkpoint taken after the call
    before: str | None = None  # checkpoint that held the state before the call
    instance: str | None = None  # Space instance the call's effects landed in
    result_entry: str | None = None  # the tool_result entry, once committed
    mark: int | None = None  # the log's position of the current start mark (log_witness.py)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @staticmethod
    def from_json(d: dict[str, Any]) -> CallRecord:
        """The record as the log holds it; its checkpoint ids must parse (they become
        file names and shell words), else ``BadCheckpointIdError``: the log is damaged."""
        rec = CallRecord(**d)
        where = f"the log's record of call {str(rec.call_id)[:80]!r}"
        rec.checkpoint = optional(rec.checkpoint, f"{where} (checkpoint)")
        rec.before = optional(rec.before, f"{where} (checkpoint before it)")
        return rec


@dataclass
class SpaceState:
    """The whole ``cua.space`` document."""

    mode: str | None = None  # "transactional" | "checkpoint"; None before the first call
    mode_reason: str | None = None
    space: str | None = None  # Space name
    instance: str | None = None  # Space instance the workspace is consistent with
    last_checkpoint: str | None = None
    image_stale: str | None = None  # why the image cannot be trusted (explicit transactional)
    boot: str | None = None  # the machine's boot id at the last commit (whole-machine Spaces)
    calls: dict[str, CallRecord] = field(default_factory=dict)
    calls_total: int = 0  # wrapped calls ever started (orders are 1..calls_total)
    #: Start marks ever committed (the log's position): what the Space's exec ledger is
    #: asked for (``log_witness.py``).
    marks: int = 0

    def to_json(self) -> dict[str, Any]:
        # Only the newest calls are kept: recovery needs the one in flight, and the
        # document is rewindable, so any older record is still readable as of its entry.
        # Keeping all would make every commit grow with the conversation (quadratic log).
        recent = sorted(self.calls.values(), key=lambda c: c.order)[-KEEP_CALLS:]
        return {
            "mode": self.mode,
            "mode_reason": self.mode_reason,
            "space": self.space,
            "instance": self.instance,
            "last_checkpoint": self.last_checkpoint,
            "image_stale": self.image_stale,
            "boot": self.boot,
            "calls": {c.call_id: c.to_json() for c in recent},
            "calls_total": self.calls_total,
            "marks": self.marks,
        }

    @staticmethod
    def from_json(d: dict[str, Any] | None) -> SpaceState:
        if not d:
            return SpaceState()
        try:
            d = json_copy(d)
            calls = {k: CallRecord.from_json(v) for k, v in (d.pop("calls", None) or {}).items()}
            state = SpaceState(**d, calls=calls)
        except BadCheckpointIdError:
            raise
        except (TypeError, AttributeError, ValueError) as e:
            raise PermanentFailure(f"the log's {DOC} document is damaged: {e}") from None
        state.last_checkpoint = optional(
            state.last_checkpoint, f"the log's {DOC} document (last checkpoint)"
        )
        # Positions become part of exec keys: a whole number, or the log is damaged
        # (``log_witness.py``).
        if type(state.marks) is not int or state.marks < 0:
            raise PermanentFailure(
                f"the log's {DOC} document is damaged: position {str(state.marks)[:40]!r}"
            )
        for rec in calls.values():
            if rec.mark is not None and (type(rec.mark) is not int or rec.mark < 0):
                raise PermanentFailure(
                    f"the log's {DOC} document is damaged: call position {str(rec.mark)[:40]!r}"
                )
        return state

    def copy(self) -> SpaceState:
        return SpaceState.from_json(self.to_json())

    @property
    def has_history(self) -> bool:
        return self.calls_total > 0 or bool(self.calls)

    def checkpoints(self) -> set[str]:
        """Every checkpoint id this document records (the ones recovery may restore)."""
        ids = {self.last_checkpoint}
        for c in self.calls.values():
            ids.update((c.checkpoint, c.before))
        return {i for i in ids if i is not None}

    def next_order(self) -> int:
        self.calls_total = max(self.calls_total, *(c.order for c in self.calls.values()), 0) + 1
        return self.calls_total


def load(harness: HarnessView, conv: str) -> SpaceState:
    """The conversation's ``cua.space`` document as committed now."""
    # Not copied here: ``from_json`` builds its own copy.
    return SpaceState.from_json(harness.conversation(conv).document(DOC, copy=False))


class ImageWrite(Protocol):
    """A new version of the image to commit with the document (``image_log.ImageUpdate``):
    a protocol, so this module does not import the image log that imports it."""

    def write(self, tx: Tx, conv: str) -> None: ...


def put(tx: Tx, conv: str, state: SpaceState) -> None:
    tx.put_document(conv, DOC, state.to_json(), rewindable=True)


async def commit(
    harness: HarnessView, conv: str, state: SpaceState, image: ImageWrite | None = None
) -> None:
    """One commit of the document (and, with ``image``, of the image's new version and
    blobs in the same transaction)."""

    def build(tx: Tx) -> None:
        if image is not None:
            image.write(tx, conv)
        put(tx, conv, state)

    await harness.commit(build)
