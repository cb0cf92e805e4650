"""What a campaign tested: kill points hit and killed at, checks and what they verified.

Read from the run records alone (``extra.trace``, ``checks``): the same report can be
rebuilt from an archived campaign directory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.trace_coverage import Coverage, coverage_of
from durable_spaces.reports.plots import save_figure


def campaign_coverage(records: Sequence[RunRecord]) -> Coverage | None:
    """The campaign's coverage; None when no record carries a trace story."""
    stories = [r.extra["trace"] for r in records if isinstance(r.extra.get("trace"), list)]
    return coverage_of(stories) if stories else None


def coverage_table(cov: Coverage) -> pd.DataFrame:
    """Per failpoint and call kind: the attempts that passed it, the kills that landed
    there, and kills followed by a recovery in the next attempt."""
    kinds = sorted({k for _, k in cov.hits} | {k for _, k in cov.kills})
    rows = []
    for point in cov.registered:
        for kind in kinds:
            hits, kills = cov.hits.get((point, kind), 0), cov.kills.get((point, kind), 0)
            if hits or kills:
                rows.append({"point": point, "call": kind, "attempts": hits, "killed": kills})
    df = pd.DataFrame(rows, columns=["point", "call", "attempts", "killed"])
    if not df.empty:
        rec = df.groupby("point")["killed"].transform("sum")
        df["recovered_after"] = [
            cov.recovered.get(p, 0) if k else 0 for p, k in zip(df["point"], rec, strict=True)
        ]
    return df


def never_hit_table(cov: Coverage) -> pd.DataFrame:
    """Registered points this campaign never passed."""
    return pd.DataFrame({"point": cov.never_hit})


def kills_heatmap(cov: Coverage, path: Path) -> Path | None:
    """Kills per failpoint (rows) and call index (columns); None when no kill landed in
    a call."""
    if not cov.kills_by_step:
        return None
    points = sorted({p for p, _ in cov.kills_by_step})
    steps = sorted({s for _, s in cov.kills_by_step})
    grid = [[cov.kills_by_step.get((p, s), 0) for s in steps] for p in points]
    fig, ax = plt.subplots(figsize=(min(12, 2 + 0.6 * len(steps)), 1 + 0.35 * len(points)))
    im = ax.imshow(grid, aspect="auto", cmap="Reds", vmin=0)
    ax.set_xticks(range(len(steps)), [str(s) for s in steps])
    ax.set_yticks(range(len(points)), points, fontsize="small")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize="x-small")
    ax.set(title="Kills landed per failpoint and call index", xlabel="call index")
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    return save_figure(fig, path)


def checks_table(records: Sequence[RunRecord]) -> pd.DataFrame:
    """Per check: runs where it passed, failed, was unknown, or did not apply (its detail
    says "not ..."), the anomalies it named, and how many things it compared over all
    runs (``verified``: calls or paths, as the check reports them)."""
    counts: dict[str, Counter[str]] = {}
    for r in records:
        for name, c in r.checks.items():
            row = counts.setdefault(name, Counter())
            valid = c.get("valid")
            detail = str(c.get("detail") or "")
            if valid is True and detail.startswith("not "):
                row["not_applicable"] += 1
            elif valid is True:
                row["passed"] += 1
            elif valid is False:
                row["failed"] += 1
            else:
                row["unknown"] += 1
            row["anomalies"] += len(c.get("anomalies") or [])
            v = c.get("verified")
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                row["verified"] += v
    cols = ["check", "passed", "failed", "unknown", "not_applicable", "anomalies", "verified"]
    rows = [{"check": n, **{k: c.get(k, 0) for k in cols[1:]}} for n, c in sorted(counts.items())]
    return pd.DataFrame(rows, columns=cols)
