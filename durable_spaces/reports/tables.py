"""Run records as pandas tables: what a campaign did and how recovery behaved.

Every table is computed from ``runs/*.json`` alone (no live state), so a report can be
rebuilt from an archived campaign directory at any time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pandas as pd

from durable_spaces.campaigns.record import RunRecord

PERCENTILES = (50, 95, 99)


def runs_frame(records: Sequence[RunRecord]) -> pd.DataFrame:
    """One row per run."""
    rows = [
        {
            "run_id": r.run_id,
            "seed": r.seed,
            "mode": r.mode,
            "backend": r.backend,
            "durable_mode": r.durable_mode,
            "calls": r.calls,
            "attempts": r.attempts,
            "kills": r.kills,
            "faults": sum(r.faults.values()),
            "recoveries": sum(r.recoveries.values()),
            "outcome": r.outcome,
            "duration_s": r.duration_s,
            "failing_checks": ",".join(r.failing_checks()),
        }
        for r in records
    ]
    return pd.DataFrame(rows, columns=[
        "run_id", "seed", "mode", "backend", "durable_mode", "calls", "attempts", "kills",
        "faults", "recoveries", "outcome", "duration_s", "failing_checks",
    ])  # fmt: skip


def _counts(records: Sequence[RunRecord], attr: str, name: str) -> pd.DataFrame:
    rows = [
        {"mode": r.mode, "backend": r.backend, name: k, "count": v}
        for r in records
        for k, v in getattr(r, attr).items()
    ]
    if not rows:
        return pd.DataFrame(columns=[name])
    df = pd.DataFrame(rows)
    table = df.pivot_table(index=name, columns="mode", values="count", aggfunc="sum", fill_value=0)
    table["total"] = table.sum(axis=1)
    table.columns.name = None
    return table.reset_index().sort_values(name).reset_index(drop=True)


def faults_table(records: Sequence[RunRecord]) -> pd.DataFrame:
    """Faults per kind (rows) and mode (columns), with a total."""
    return _counts(records, "faults", "fault")


def recoveries_table(records: Sequence[RunRecord]) -> pd.DataFrame:
    """Recoveries per kind (rows) and the mode each was decided in (columns), with a total.

    Records that carry ``extra["recoveries_by_mode"]`` ("<mode>/<kind>": n, from the
    events themselves) are split by that mode (an auto campaign has both); others by the
    campaign's mode."""
    rows = []
    for r in records:
        split = r.extra.get("recoveries_by_mode")
        if split:
            for key, n in split.items():
                mode, _, kind = str(key).partition("/")
                rows.append({"mode": mode, "recovery": kind, "count": n})
        else:
            rows += [{"mode": r.mode, "recovery": k, "count": v} for k, v in r.recoveries.items()]
    if not rows:
        return pd.DataFrame(columns=["recovery"])
    df = pd.DataFrame(rows)
    table = df.pivot_table(
        index="recovery", columns="mode", values="count", aggfunc="sum", fill_value=0
    )
    table["total"] = table.sum(axis=1)
    table.columns.name = None
    return table.reset_index().sort_values("recovery").reset_index(drop=True)


def attempts_table(records: Sequence[RunRecord]) -> pd.DataFrame:
    """How many runs needed n drive attempts."""
    s = pd.Series([r.attempts for r in records], dtype="int64")
    t = s.value_counts().sort_index().rename_axis("attempts").reset_index(name="runs")
    return t


def latency_table(records: Sequence[RunRecord]) -> pd.DataFrame:
    """Resume latency (kill -> next first step, ms) per mode and backend; the
    ``*_excl_backoff_ms`` columns subtract the backoff slept (runs that recorded it)."""
    rows = []
    groups: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for r in records:
        xs, net = groups.setdefault((r.mode, r.backend), ([], []))
        xs.extend(r.resume_latencies_ms)
        if len(r.resume_backoffs_ms) == len(r.resume_latencies_ms):
            net.extend(
                x - b for x, b in zip(r.resume_latencies_ms, r.resume_backoffs_ms, strict=True)
            )

    def q(s: pd.Series, p: float) -> float | None:
        return round(float(s.quantile(p)), 1) if len(s) else None

    for (mode, backend), (xs, net) in sorted(groups.items()):
        s = pd.Series(xs, dtype="float64")
        n = pd.Series(net, dtype="float64")
        row: dict[str, object] = {"mode": mode, "backend": backend, "samples": len(xs)}
        for p in PERCENTILES:
            row[f"p{p}_ms"] = q(s, p / 100)
        row["max_ms"] = round(float(s.max()), 1) if xs else None
        row["p50_excl_backoff_ms"] = q(n, 0.5)
        row["p95_excl_backoff_ms"] = q(n, 0.95)
        rows.append(row)
    cols = [
        "mode", "backend", "samples", *(f"p{p}_ms" for p in PERCENTILES), "max_ms",
        "p50_excl_backoff_ms", "p95_excl_backoff_ms",
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def outcomes_table(records: Sequence[RunRecord]) -> pd.DataFrame:
    """Runs per outcome, per mode and backend."""
    df = runs_frame(records)
    if df.empty:
        return pd.DataFrame(columns=["mode", "backend", "ok", "failed", "lab_error", "runs"])
    t = df.pivot_table(index=["mode", "backend"], columns="outcome", values="run_id",
                       aggfunc="count", fill_value=0)  # fmt: skip
    for col in ("ok", "failed", "lab_error"):
        if col not in t.columns:
            t[col] = 0
    t = t[["ok", "failed", "lab_error"]]
    t["runs"] = t.sum(axis=1)
    t.columns.name = None
    return t.reset_index()


def missing_table(records: Sequence[RunRecord]) -> pd.DataFrame:
    """Features the runs' Spaces lacked on their host, with why, and in how many runs
    (``extra["space_missing"]``: a local Space without cgroups, say)."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for r in records:
        missing = r.extra.get("space_missing")
        if isinstance(missing, dict):
            for feature, why in missing.items():
                counts[(r.backend, str(feature), str(why))] += 1
    rows = [
        {"backend": b, "feature": f, "why": w, "runs": n} for (b, f, w), n in sorted(counts.items())
    ]
    return pd.DataFrame(rows, columns=["backend", "feature", "why", "runs"])


def all_tables(records: Sequence[RunRecord]) -> dict[str, pd.DataFrame]:
    """Every table of the report, by title, in report order."""
    return {
        "Outcomes": outcomes_table(records),
        "Faults": faults_table(records),
        "Recoveries by kind and mode": recoveries_table(records),
        "Attempts per run": attempts_table(records),
        "Resume latency (ms)": latency_table(records),
        "Space features missing on the host": missing_table(records),
    }
