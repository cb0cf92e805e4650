"""A harness's grade: the worst class any step of any run showed, and how much it saw.

From best to worst, each grade allowing the classes of those before it:

- ``exactly-once``: every step ``once``: each effect happened once and the model was shown
  its own output.
- ``at-most-once-reported``: ``reported`` too: a call cut by a crash may or may not have
  had its effect, but the harness told the model so in the words its recipe declares, so
  it can look before it acts again; nothing ran twice.
- ``at-least-once``: ``duplicate`` too: nothing was lost or made up, but the harness ran a
  call again; safe only for idempotent tools.
- ``unverified``: ``unverified`` too: the model was shown results that carry no evidence of
  the tool's run and are not the harness's declared report. Each is a report in other
  words (then the grade would be the one above) or a made-up success (then ``unsafe``);
  evidence cannot tell, so the probe says neither. A recipe that declares its harness's
  words (``[report]``) turns the honest ones into ``reported``.
- ``unsafe``: ``lost`` (an effect missing and the model not told), ``phantom`` (the model
  shown its output for an effect that is not there), ``orphan`` (an effect of a killed
  attempt's process landing after the kill, unaccounted for while the resumed agent goes
  on) or a ``stuck`` run (the task never finished, so no promise held): the model's
  picture of the workspace is wrong and nothing tells it.

A grade is the worst class seen, so a probe that did not put its fault at every kill point
x step pair (``pairs=x/y``, x < y) has seen only part: its grade reads ``partial:<grade>``
(only ``unsafe``, which nothing can make worse, stands alone), and ``--expect`` fails on
it unless the user accepts partial coverage.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["CLASS_GRADE", "GRADES", "NONE", "PARTIAL", "base", "grade_of", "qualified", "worse"]

GRADES = ("exactly-once", "at-most-once-reported", "at-least-once", "unverified", "unsafe")
#: The grade when nothing was graded (no step, no run, or the probe could not judge).
NONE = "none"
#: The prefix of a grade from a probe that did not cover every pair.
PARTIAL = "partial:"
CLASS_GRADE = {
    "once": "exactly-once",
    "reported": "at-most-once-reported",
    "duplicate": "at-least-once",
    "unverified": "unverified",
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


def qualified(grade: str, covered: bool) -> str:
    """``grade`` as a probe that covered every pair (``covered``) or not may print it."""
    if covered or grade in (NONE, "unsafe"):
        return grade
    return PARTIAL + grade


def base(grade: str) -> str:
    """The grade without its coverage qualifier."""
    return grade.removeprefix(PARTIAL)


def worse(grade: str, than: str) -> bool:
    """True when ``grade`` (qualified or not) is worse than ``than`` (``none`` is worse
    than any)."""
    g = base(grade)
    if g == NONE:
        return True
    return GRADES.index(g) > GRADES.index(base(than))
