"""Two campaign directories side by side: what changed in outcomes, recoveries, faults,
coverage and resume latency (``durable-spaces report --compare A B``). A question such as
"did this change make recovery slower, or stop hitting a point?" is one table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from durable_spaces.campaigns.record import RunRecord, scan_records
from durable_spaces.campaigns.summary import percentile
from durable_spaces.errors import ConfigError
from durable_spaces.reports.coverage import campaign_coverage


def _load(d: Path, skipped: list[tuple[Path, str]]) -> list[RunRecord]:
    if not (d / "runs").is_dir() or (d / "runs").is_symlink():
        raise ConfigError(f"{d} is not a campaign directory (no runs/ directory)")
    scan = scan_records(d)
    skipped.extend(scan.skipped)
    if not scan.records:
        raise ConfigError(f"{d}: no run record could be read, of {len(scan.skipped)} file(s)")
    return scan.records


def _figures(records: Sequence[RunRecord]) -> dict[str, float | int | str | None]:
    out: dict[str, float | int | str | None] = {}
    outcomes = Counter(r.outcome for r in records)
    out["runs"] = len(records)
    for k in ("ok", "failed", "lab_error"):
        out[f"outcome {k}"] = outcomes.get(k, 0)
    out["kills"] = sum(r.kills for r in records)
    for kind, n in sorted(sum((Counter(r.faults) for r in records), Counter()).items()):
        out[f"fault {kind}"] = n
    for kind, n in sorted(sum((Counter(r.recoveries) for r in records), Counter()).items()):
        out[f"recovery {kind}"] = n
    lat = [x for r in records for x in r.resume_latencies_ms]
    for q in (50, 95, 99):
        p = percentile(lat, q)
        out[f"resume p{q} ms"] = None if p is None else round(p, 1)
    cov = campaign_coverage(records)
    if cov is not None:
        out["coverage"] = cov.fraction()
        out["points killed at"] = len({p for p, _ in cov.kills})
    return out


def compare(a: Path, b: Path, skipped: list[tuple[Path, str]] | None = None) -> pd.DataFrame:
    """One row per figure: A's value, B's, and B - A where both are numbers. Each file
    of A's or B's ``runs/`` that is not a record is left out and appended to ``skipped``
    with the reason (the figures are of the rest)."""
    out = [] if skipped is None else skipped
    fa, fb = _figures(_load(a, out)), _figures(_load(b, out))
    rows = []
    for key in list(dict.fromkeys([*fa, *fb])):
        va, vb = fa.get(key), fb.get(key)
        delta: float | int | None = None
        if isinstance(va, int | float) and isinstance(vb, int | float):
            d = vb - va
            delta = d if isinstance(d, int) else round(d, 1)
        elif va is None and isinstance(vb, int) and not key.startswith("resume"):
            delta, va = vb, 0
        elif vb is None and isinstance(va, int) and not key.startswith("resume"):
            delta, vb = -va, 0
        rows.append({"figure": key, "A": va, "B": vb, "B - A": delta})
    return pd.DataFrame(rows, columns=["figure", "A", "B", "B - A"])
