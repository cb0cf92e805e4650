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
- ``failpoints_off``: every failpoint is a no-op (``chaos/failpoints.py``'s ``hit``
  neither acts nor traces), as a build whose failpoints were compiled out, or a lab whose
  arming no longer reaches its drivers, would be: the schedule's failpoint kills, and the
  faults placed at points, never land, and an exhaustive campaign's trace finds no hit.
  Nothing the checker sees is wrong; the campaign's exit rule (``campaigns/earned.py``:
  the kills that landed against the planned ones) is what must catch it.
- ``checkpoint_misses_call``: every other workspace checkpoint a driver takes of a host
  workspace holds the files changed since the one before as that one held them (a new
  file left out), as a listing that trusted a stale look would; the next one holds the
  change again (``adapter/checkpoints/manifest_build.py``). The last checkpoint of a run can agree
  with the workspace while a call's own did not (``checkpoint_follows_calls``); a restore
  in between would have brought back a workspace without the call's change.
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

from durable_spaces.errors import ConfigError

MUTANTS = (
    "rerun_exited",
    "unfenced_mutations",
    "unfenced_log",
    "journal_miss",
    "journal_loss_trusted",
    "checkpoint_misses_call",
    "log_behind_blind",
    "no_fence_poll",
    "failpoints_off",
)

_active: frozenset[str] = frozenset()
_bad: str | None = None


def check(value: str | None) -> frozenset[str]:
    """The mutants ``value`` names (``DS_MUTANTS``'s form: comma-separated names);
    ``ConfigError`` in one line for a name that is not one (the CLI refuses it before any
    work, from the environment or from a run record alike)."""
    names = frozenset(filter(None, (value or "").split(",")))
    unknown = names - set(MUTANTS)
    if unknown:
        raise ConfigError(
            f"DS_MUTANTS={value!r} names unknown mutants {', '.join(sorted(unknown))} "
            f"(known: {', '.join(MUTANTS)})"
        )
    return names


def load(value: str | None) -> None:
    """Switch on the mutants ``value`` names (``DS_MUTANTS``'s form): at import from the
    environment, and again when ``repro --exact`` takes on a run record's."""
    global _active, _bad
    _active, _bad = check(value), None


def _load_at_import() -> None:
    """The environment's mutants. An unknown name does not fail the import (a command
    importing the lab would end in a traceback before it could say so in one line): it
    is kept, the CLI refuses it before any work (``cli/app.py``), and ``active`` raises
    it anywhere else, so a run never goes on without the mutants it asked for."""
    global _bad
    try:
        load(os.environ.get("DS_MUTANTS"))
    except ConfigError as e:
        _bad = str(e)


def problem() -> str | None:
    """Why the environment's ``DS_MUTANTS`` was refused at import (None: it was not)."""
    return _bad


def active(name: str) -> bool:
    if _bad is not None:
        raise ConfigError(_bad)
    return name in _active


_load_at_import()
