"""A failed run drawn as a timeline: one lane per attempt (its epoch), the wrapped calls
as spans, kills, fence refusals and recoveries as marks, the first anomaly's witness
calls outlined. Read from the run record alone (``extra.trace``, ``extra.recovery_sequence``,
``checks``), as Jepsen draws a history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.trace_coverage import call_kind, call_step
from durable_spaces.reports.plots import save_figure

#: Exit codes with a meaning of their own on a lane (drive/protocol.py's contract).
_EXITS = {-9: "killed", 75: "fenced", 78: "failed", 0: "done"}


def first_anomaly(record: RunRecord) -> tuple[str, dict[str, Any]] | None:
    """The first anomaly of the first failing check, with the check's name."""
    for name in record.failing_checks():
        check: dict[str, Any] = dict(record.checks.get(name) or {})
        for a in check.get("anomalies") or []:
            if isinstance(a, dict):
                return name, a
    return None


def _witness_calls(record: RunRecord) -> set[str]:
    found = first_anomaly(record)
    if found is None:
        return set()
    return {str(w) for w in found[1].get("witness") or [] if isinstance(w, str)}


def _recoveries(record: RunRecord) -> list[tuple[int, str, str]]:
    """``(epoch, kind, call_id)`` of every recovery decision, in order."""
    out = []
    for item in record.extra.get("recovery_sequence") or []:
        parts = str(item).split(":", 2)
        if len(parts) == 3 and parts[0].lstrip("-").isdigit():
            out.append((int(parts[0]), parts[1], parts[2]))
    return out


def has_timeline(record: RunRecord) -> bool:
    stories = record.extra.get("trace")
    return isinstance(stories, list) and any(
        isinstance(s, dict) and s.get("first_us") is not None for s in stories
    )


def timeline_plot(record: RunRecord, path: Path) -> Path | None:
    """The run's timeline as a PNG at ``path``; None when the record has no trace."""
    if not has_timeline(record):
        return None
    stories = [s for s in record.extra["trace"] if isinstance(s, dict)]
    t0 = min(s["first_us"] for s in stories if isinstance(s.get("first_us"), int))
    witness = _witness_calls(record)
    recov = _recoveries(record)

    def ms(us: Any) -> float | None:
        return (us - t0) / 1000 if isinstance(us, int) else None

    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.9 * len(stories)))
    for lane, s in enumerate(stories):
        y = len(stories) - 1 - lane
        start, end = ms(s.get("first_us")), ms(s.get("last_us"))
        if start is not None and end is not None:
            ax.plot([start, end], [y, y], color="#bbbbbb", linewidth=1, zorder=1)
        for c in s.get("calls") or []:
            a, b = ms(c.get("first_us")), ms(c.get("last_us"))
            if a is None or b is None:
                continue
            call = str(c.get("call"))
            call_id = call.split(":", 1)[-1]
            hot = call_id in witness
            ax.barh(y, max(b - a, 0.3), left=a, height=0.5, zorder=2,
                    color="#f4a261" if hot else "#4878a8",
                    edgecolor="#d00000" if hot else "none", linewidth=2 if hot else 0)  # fmt: skip
            step = call_step(call)
            label = f"{call_kind(call)}" + ("" if step is None else f" #{step}")
            ax.text(a, y + 0.3, label, fontsize="x-small", va="bottom")
            for epoch, kind, rc in recov:
                if epoch == s.get("epoch") and rc == call_id:
                    ax.plot([a], [y - 0.35], marker="^", color="#2a9d8f", zorder=3)
                    ax.text(a, y - 0.55, f"recovery: {kind}", fontsize="x-small",
                            color="#2a9d8f", va="top")  # fmt: skip
        code = s.get("exit_code")
        if end is not None and code in _EXITS and code != 0:
            color = "#d00000" if code == -9 else "#6a4c93"
            ax.plot([end], [y], marker="X", markersize=10, color=color, zorder=4)
            where = (s.get("ended_at") or {}).get("point", "")
            ax.text(end, y - 0.3, f"{_EXITS[code]} {where}", fontsize="x-small", color=color,
                    va="top")  # fmt: skip
    ax.set_yticks(
        range(len(stories)),
        [f"attempt {s.get('attempt')} (epoch {s.get('epoch')})" for s in reversed(stories)],
    )
    ax.set_ylim(-1, len(stories))
    title = f"{record.run_id}: calls per attempt; outlined: the first anomaly's witness"
    ax.set(xlabel="ms since the run's first step", title=title)
    fig.tight_layout()
    return save_figure(fig, path)
