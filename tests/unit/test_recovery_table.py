"""The recovery decision table as a pure function: every row of the README's table."""

from __future__ import annotations

import pytest

from durable_spaces.adapter.recovery import Decision, decide
from durable_spaces.space import ExecRecord, ExecState


def _rec(state: ExecState, code: int | None = None, sig: int | None = None) -> ExecRecord:
    return ExecRecord("k", state, exit_code=code, signal=sig)


@pytest.mark.parametrize(
    ("facts", "want"),
    [
        # outcome recorded: adopt (checkpoint mode only in the Space it landed in)
        (dict(outcome_recorded=True, same_instance=True, mode="checkpoint", ledger=None,
              older=False), Decision.ADOPT),
        (dict(outcome_recorded=True, same_instance=False, mode="transactional", ledger=None,
              older=False), Decision.ADOPT),
        (dict(outcome_recorded=True, same_instance=False, mode="checkpoint", ledger=None,
              older=False), Decision.UNDO),
        # the command is running under this epoch: reattach; under an older one: never
        (dict(outcome_recorded=False, same_instance=True, mode="transactional",
              ledger=_rec(ExecState.RUNNING), older=False), Decision.REATTACH),
        (dict(outcome_recorded=False, same_instance=True, mode="transactional",
              ledger=_rec(ExecState.RUNNING), older=True), Decision.UNDO),
        # exited: replay; started by an older epoch, only if it exited cleanly
        (dict(outcome_recorded=False, same_instance=True, mode="checkpoint",
              ledger=_rec(ExecState.EXITED, 3), older=False), Decision.REPLAY),
        (dict(outcome_recorded=False, same_instance=True, mode="checkpoint",
              ledger=_rec(ExecState.EXITED, 0), older=True), Decision.REPLAY),
        (dict(outcome_recorded=False, same_instance=True, mode="checkpoint",
              ledger=_rec(ExecState.EXITED, None, 9), older=True), Decision.UNDO),
        (dict(outcome_recorded=False, same_instance=True, mode="checkpoint",
              ledger=_rec(ExecState.EXITED, 1), older=True), Decision.UNDO),
        # never started: run it
        (dict(outcome_recorded=False, same_instance=True, mode="transactional",
              ledger=_rec(ExecState.UNKNOWN), older=True), Decision.RUN),
        # lost with the daemon, or a file tool (no ledger), or another instance: unknown
        (dict(outcome_recorded=False, same_instance=True, mode="transactional",
              ledger=_rec(ExecState.LOST), older=False), Decision.UNDO),
        (dict(outcome_recorded=False, same_instance=True, mode="checkpoint", ledger=None,
              older=False), Decision.UNDO),
        (dict(outcome_recorded=False, same_instance=False, mode="transactional",
              ledger=_rec(ExecState.EXITED, 0), older=False), Decision.UNDO),
    ],
)  # fmt: skip
def test_every_row_of_the_recovery_table(facts: dict[str, object], want: Decision) -> None:
    assert decide(**facts) is want  # type: ignore[arg-type]
