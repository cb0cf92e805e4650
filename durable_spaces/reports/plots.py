"""Plots of a campaign as PNG files (matplotlib, Agg: no display needed)."""

from __future__ import annotations

import io
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from durable_spaces.campaigns.record import RunRecord
from durable_spaces.reports.output import write_file


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Render in memory, then write whole (``write_file``: never through a symlink)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return write_file(Path(path), buf.getvalue())


def latency_plot(records: Sequence[RunRecord], path: str | Path) -> Path:
    """Resume latency: histogram and ECDF side by side (a placeholder text without data)."""
    xs = sorted(x for r in records for x in r.resume_latencies_ms)
    fig, (hist, ecdf) = plt.subplots(1, 2, figsize=(10, 4))
    if xs:
        hist.hist(xs, bins=min(30, max(5, len(xs) // 3)), color="#4878a8")
        ecdf.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post")
        ecdf.set_ylim(0, 1.02)
    else:
        for ax in (hist, ecdf):
            ax.text(0.5, 0.5, "no resume samples", ha="center", va="center")
    hist.set(title="Resume latency", xlabel="ms (kill -> next first step)", ylabel="resumes")
    ecdf.set(title="Resume latency ECDF", xlabel="ms", ylabel="fraction <= x")
    fig.tight_layout()
    return save_figure(fig, path)


def recoveries_plot(records: Sequence[RunRecord], path: str | Path) -> Path:
    """Per fault kind, the recoveries of the runs that had it, stacked by recovery kind."""
    by_fault: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        for fault in r.faults or {"no fault": 1}:
            by_fault[fault].update(r.recoveries)
    # a category with no recovery is left out (an empty column says nothing)
    faults = sorted(f for f, c in by_fault.items() if sum(c.values()))
    kinds = sorted({k for c in by_fault.values() for k in c})
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0] * len(faults)
    for kind in kinds:
        vals = [by_fault[f][kind] for f in faults]
        ax.bar(faults, vals, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    if kinds:
        ax.legend(title="recovery", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no recoveries", ha="center", va="center", transform=ax.transAxes)
    ax.set(title="Recoveries in runs with each fault kind", xlabel="fault", ylabel="recoveries")
    fig.tight_layout()
    return save_figure(fig, path)
