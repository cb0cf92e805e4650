"""A harness's grade: the worst class any step of any run showed.

From best to worst, each grade allowing the classes of those before it:

- ``exactly-once``: every step ``once``: each effect happened once and the model was shown
  its own output.
- ``at-most-once-reported``: ``reported`` too: a call cut by a crash may or may not have
  had its effect, but the model was told so (an error or an interruption), so it can look
  before it acts again; nothing ran twice.
- ``at-least-once``: ``duplicate`` too: nothing was lost or made up, but an effect ran
  again; safe only for idempotent tools.
- ``unsafe``: ``lost`` (an effect missing and the model not told), ``phantom`` (the model
  shown a success it could not have had), ``orphan`` (an effect of a killed attempt's
  process landing after the kill, unaccounted for while the resumed agent goes on) or a
  ``stuck`` run (the task never finished, so no promise held): the model's picture of the
  workspace is wrong and nothing tells it.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["CLASS_GRADE", "GRADES", "NONE", "grade_of", "worse"]

GRADES = ("exactly-once", "at-most-once-reported", "at-least-once", "unsafe")
#: The grade when nothing was graded (no step, no run).
NONE = "none"
CLASS_GRADE = {
    "once": "exactly-once",
    "reported": "at-most-once-reported",
    "duplicate": "at-least-once",
    "lost": "unsafe",
    "phantom": "unsafe",
    "orphan": "unsafe",
    "stuck": "unsafe",
}


def grade_of(classes: Iterable[str]) -> str:
    """The worst grade of ``classes`` (step classes, and ``stuck`` for a stuck run)."""
    worst = -1
    for c in classes:
        worst = max(worst, GRADES.index(CLASS_GRADE[c]))
    return NONE if worst < 0 else GRADES[worst]


def worse(grade: str, than: str) -> bool:
    """True when ``grade`` is worse than ``than`` (``none`` is worse than any)."""
    if grade == NONE:
        return True
    return GRADES.index(grade) > GRADES.index(than)
