"""Mutants: deliberately broken builds of the adapter, to prove the lab catches them.

A chaos lab that never fails proves nothing. ``DS_MUTANTS="name[,name]"`` switches on a
named defect in the product code (each call site asks ``active("name")``), and the test
suite checks that a campaign fails it and prints a repro command that fails again.
Unset (always, in production), ``active`` is one frozenset lookup.

- ``rerun_exited``: recovery ignores the ledger's record of an exited command and runs
  it again (the bug the exec ledger exists to prevent: a step applied twice).
"""

from __future__ import annotations

import os

MUTANTS = ("rerun_exited",)

_active = frozenset(filter(None, os.environ.get("DS_MUTANTS", "").split(",")))
_unknown = _active - set(MUTANTS)
if _unknown:
    raise ValueError(f"DS_MUTANTS names unknown mutants {sorted(_unknown)}; known: {MUTANTS}")


def active(name: str) -> bool:
    return name in _active
