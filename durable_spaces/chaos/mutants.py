"""Mutants: deliberately broken builds of the adapter, to prove the lab catches them.

A chaos lab that never fails proves nothing. ``DS_MUTANTS="name[,name]"`` switches on a
named defect in the product code (each call site asks ``active("name")``), and the test
suite checks that a campaign fails it and prints a repro command that fails again.
Unset (always, in production), ``active`` is one frozenset lookup.

- ``rerun_exited``: recovery ignores the ledger's record of an exited command and runs
  it again (the bug the exec ledger exists to prevent: a step applied twice).
- ``unfenced_mutations``: the Space's file operations (write, symlink, remove) ignore
  the caller's epoch, as they did before they were fenced: a driver paused mid-call and
  continued after a takeover writes into the newer driver's workspace.
- ``unfenced_log``: a SQLite log's commits (and its fence check) ignore the floor a newer
  epoch raised: a driver that comes back from a stalled disk (or a pause) after a
  takeover commits beside its successor (the checker's ``stale_commit``).
- ``journal_miss``: the change journal of a host workspace (``backends/local/journal.py``)
  drops the events that say a file's contents changed, as a watcher that lost them
  would: an append to an existing file never reaches the image, and the workspace and
  the log's image part (the checker's ``image_equals_workspace``).
- ``journal_loss_trusted``: the change journal in the Space
  (``backends/spacesd/guest_journal.py``) answers a scan from what it last knew when its
  helper is gone (killed, exited), as if nothing changed since: a call whose command ran
  while its helper died is credited with nothing (``image_follows_calls``; the next
  call's start folds the change in, so the end agrees; the lab's ``journal_kill`` fault
  is what makes it show).
- ``log_behind_blind``: the adapter as it was before the log's witness
  (``adapter/log_witness.py``): it never asks the ledger, and exec keys carry the epoch
  (a forgotten call issued again by a newer driver gets a new key): a log that lost its
  tail on the same boot leaves the Space's effects of the forgotten calls in place, and
  they run again (``duplicate_effect``; the lab's ``log_loss`` fault makes it show).
- ``no_fence_poll``: the driver does not poll the log's fence while it waits for the
  run (it stops only when a write of its own is refused). Not a defect: a test runs with
  it to prove the Space's fence alone stops a stale driver, since a poll every 0.2 s
  cannot stop an operation already issued.
"""

from __future__ import annotations

import os

MUTANTS = (
    "rerun_exited",
    "unfenced_mutations",
    "unfenced_log",
    "journal_miss",
    "journal_loss_trusted",
    "log_behind_blind",
    "no_fence_poll",
)

_active: frozenset[str] = frozenset()


def load(value: str | None) -> None:
    """Switch on the mutants ``value`` names (``DS_MUTANTS``'s form): at import from the
    environment, and again when ``repro --exact`` takes on a run record's."""
    global _active
    names = frozenset(filter(None, (value or "").split(",")))
    unknown = names - set(MUTANTS)
    if unknown:
        raise ValueError(f"DS_MUTANTS names unknown mutants {sorted(unknown)}; known: {MUTANTS}")
    _active = names


load(os.environ.get("DS_MUTANTS"))


def active(name: str) -> bool:
    return name in _active
