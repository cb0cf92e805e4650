"""Recovery of an interrupted call: the decision table, and the events that report it.

``decide`` is the table (README, "Recovery of an interrupted call") as a pure function of
what is known about the call; ``calls.py`` gathers the facts (the log's record, the exec
ledger, the Space instance) and carries the decision out. Every decision is reported as
a ``RecoveryEvent`` that says the mode it was decided in, so campaigns can count them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from durable_spaces.space import ExecRecord, ExecState

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
    "log_behind",  # the Space's ledger knew a position the log lost (log_witness.py)
    "claimed",  # another log's Space was taken, as asked (DS_SPACE_ADOPT, space_owner.py)
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


class Decision(enum.Enum):
    """What recovery does with an interrupted call (the table in the README)."""

    ADOPT = "adopt"  # the outcome was recorded: use it (take a missing checkpoint)
    REATTACH = "reattach"  # the command is still running under this epoch: wait for it
    REPLAY = "replay"  # the command exited: its recorded outcome stands
    RUN = "run"  # the command never started: run it under a new key
    UNDO = "undo"  # unknown: revert or restore, then rerun (write/edit) or interrupt


def decide(
    *,
    outcome_recorded: bool,
    same_instance: bool,
    mode: str,
    ledger: ExecRecord | None,
    older: bool,
) -> Decision:
    """The decision table, as a function of what is known.

    ``same_instance``: the Space is the instance the call's effects landed in (a Space
    placed again holds none of them). ``ledger``: the exec ledger's record of the call's
    key (bash calls in the same instance; None for file tools or another instance).
    ``older``: the key was started under an epoch older than this driver's; a command
    cut off when a newer driver advanced the epoch is never adopted unless it exited
    cleanly (its outcome was decided by a kill, not by the command)."""
    if outcome_recorded and (same_instance or mode == "transactional"):
        return Decision.ADOPT
    if ledger is not None and same_instance:
        if ledger.state is ExecState.RUNNING and not older:
            return Decision.REATTACH
        if ledger.state is ExecState.EXITED and (
            not older or (ledger.exit_code == 0 and ledger.signal is None)
        ):
            return Decision.REPLAY
        if ledger.state is ExecState.UNKNOWN:
            return Decision.RUN
    return Decision.UNDO
