"""Recovery events: every decision the adapter takes about an interrupted call.

The decision table (DESIGN.md, "Recovery of an interrupted call") lives in
``calls.py`` where the call's state is; this module names the outcomes so campaigns can
count them and every event says which mode it was decided in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

RecoveryKind = Literal[
    "adopted",  # the outcome was recorded: use it (take the missing checkpoint)
    "reattached",  # the command is still running: wait for it
    "replayed",  # the command exited: its recorded outcome stands, it does not run again
    "ran",  # the command never started (or was undone): it runs now
    "restored",  # the Space was restored to the checkpoint before the call
    "interrupted",  # the call ends interrupted (the model decides)
    "reverted",  # transactional: the workspace was made equal to the image again
    "reimaged",  # transactional: a lost Space was rebuilt from the log alone
    "mode",  # auto switched the conversation to checkpoint mode for good
]

RECOVERY_KINDS: tuple[str, ...] = RecoveryKind.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class RecoveryEvent:
    kind: RecoveryKind
    mode: str
    call: str | None
    conversation: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


RecoveryListener = Callable[[RecoveryEvent], None]
