"""What the power losses of a run did to the host's state, named (``campaigns/power.py``).

The host observes each cut from outside, with every process dead: the log's commits and
fence floor just before the power went and just after it came back, and the exec ledger
of the ``local`` Space. Per cut it names:

- ``log_rolled_back``: commits the log had are gone after the cut (``lost`` of them,
  beyond those in flight: a commit whose fsync a stalled disk still held when the power
  went, or whose driver was killed inside it, was never acknowledged; a reader may see
  it before the cut, recovering the log's written WAL, and it is gone after;
  ``in_flight_commits`` counts them, ``campaigns/power.py``'s ``killed_in_commit``
  the second kind);
  SQLite ``NORMAL`` documents that it may lose the newest commits then, ``FULL`` does
  not: with ``FULL`` it is a failure of the log's durability, with ``NORMAL`` the run
  is still judged by whether the adapter brought the Space back to what the log kept;
- ``space_ahead``: after the cut the Space holds what the log does not: a ledger key
  started under an epoch the log has no commit of (the command ran; its start mark is
  gone), or an epoch floor above the log's. The adapter must bring the Space back to
  the log (revert to the image, or restore the newest checkpoint);
- a ``duplicate_effect`` or ``lost_effect`` after that is ``checks/effects.py``'s.

The same holds for a JSONL log with an fsync per commit (durable like ``FULL``) and one
without (``OFF``: like ``NORMAL``, it may lose its newest commits).

The check passes unless a durable log rolled back; its detail counts what it saw.
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
    if (cut.get("lost_commits") or 0) > (cut.get("in_flight_commits") or 0):
        names.append("log_rolled_back")
    if cut.get("space_ahead"):
        names.append("space_ahead")
    return names


def log_label(synchronous: str | None, log_format: str = "sqlite") -> str:
    """The log as docs/lab.md's power-loss table names it: ``SQLite FULL``, ``JSONL fsync``, ..."""
    sync = (synchronous or "NORMAL").upper()
    if log_format == "jsonl":
        return "JSONL no fsync" if sync == "OFF" else "JSONL fsync"
    return f"SQLite {sync}"


def durable(synchronous: str | None, log_format: str = "sqlite") -> bool:
    """Whether the log promises its commits survive a host crash."""
    return log_label(synchronous, log_format) in ("SQLite FULL", "JSONL fsync")


def power_losses(
    cuts: Sequence[Mapping[str, Any]], synchronous: str | None, log_format: str = "sqlite"
) -> Verdict:
    """Every cut of the run; failed when a log promised as durable (``FULL``, JSONL with
    an fsync per commit) lost a commit."""
    if not cuts:
        return passed("no power loss landed")
    counts: Counter[str] = Counter(n for c in cuts for n in seen(c))
    lost = sum(int(c.get("lost_commits") or 0) for c in cuts)
    summary = ", ".join(f"{n}: {counts[n]}" for n in NAMES if counts[n]) or "nothing lost"
    label = log_label(synchronous, log_format)
    detail = f"{len(cuts)} cuts, {lost} commits lost ({summary}; log {label})"
    bad = []
    if durable(synchronous, log_format):
        for i, c in enumerate(cuts):
            if "log_rolled_back" in seen(c):
                bad.append(
                    anomaly(
                        "log_rolled_back",
                        f"cut {i}: {c['lost_commits']} commits of a durable log ({label}) lost",
                        witness=[int(c.get("commits_after") or 0) + 1],
                    )
                )
    return judge(bad, detail)


__all__ = ["NAMES", "durable", "log_label", "power_losses", "seen"]
