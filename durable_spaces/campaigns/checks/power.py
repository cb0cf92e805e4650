"""What the power losses of a run did to the host's state, named (``campaigns/power.py``).

The host observes each cut from outside, with every process dead: the log's commits and
fence floor just before the power went and just after it came back, and the exec ledger
of the ``local`` Space. Per cut it names:

- ``log_rolled_back``: commits the log had are gone after the cut (``lost`` of them);
  SQLite ``NORMAL`` documents that it may lose the newest commits then, ``FULL`` does
  not: with ``FULL`` it is a failure of the log's durability, with ``NORMAL`` the run
  is still judged by whether the adapter brought the Space back to what the log kept;
- ``space_ahead``: after the cut the Space holds what the log does not: a ledger key
  started under an epoch the log has no commit of (the command ran; its start mark is
  gone), or an epoch floor above the log's. The adapter must bring the Space back to
  the log (revert to the image, or restore the newest checkpoint);
- a ``duplicate_effect`` or ``lost_effect`` after that is ``checks/effects.py``'s.

The check passes unless a ``FULL`` log rolled back; its detail counts what it saw.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from durable_spaces.campaigns.checks.verdict import Verdict, anomaly, judge, passed

#: The anomalies a cut can show (in the record's ``extra["power"]`` too).
NAMES = ("log_rolled_back", "space_ahead")


def seen(cut: Mapping[str, Any]) -> list[str]:
    """The names a cut's observation shows (see the module doc)."""
    names = []
    if (cut.get("lost_commits") or 0) > 0:
        names.append("log_rolled_back")
    if cut.get("space_ahead"):
        names.append("space_ahead")
    return names


def power_losses(cuts: Sequence[Mapping[str, Any]], synchronous: str | None) -> Verdict:
    """Every cut of the run; failed when a log promised as durable (``FULL``) lost a
    commit."""
    if not cuts:
        return passed("no power loss landed")
    counts: Counter[str] = Counter(n for c in cuts for n in seen(c))
    lost = sum(int(c.get("lost_commits") or 0) for c in cuts)
    summary = ", ".join(f"{n}: {counts[n]}" for n in NAMES if counts[n]) or "nothing lost"
    detail = f"{len(cuts)} cuts, {lost} commits lost ({summary}; log {synchronous or 'NORMAL'})"
    bad = []
    if (synchronous or "NORMAL").upper() == "FULL":
        for i, c in enumerate(cuts):
            if "log_rolled_back" in seen(c):
                bad.append(
                    anomaly(
                        "log_rolled_back",
                        f"cut {i}: {c['lost_commits']} commits of a synchronous=FULL log lost",
                        witness=[int(c.get("commits_after") or 0) + 1],
                    )
                )
    return judge(bad, detail)


__all__ = ["NAMES", "power_losses", "seen"]
