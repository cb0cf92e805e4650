"""The README's power-loss table, from campaign output directories.

    python -m bench.power_table OUT_DIR [OUT_DIR ...]

Each ``OUT_DIR`` is a ``durable-spaces campaign --profile power|power-normal|power-jsonl|
power-jsonl-nofsync`` output
(``campaigns/runner.py``'s layout). One Markdown row per campaign: the log's level, the
adapter's mode, consistent runs of all, power losses that landed, commits lost per cut
(mean and max, read by the host just before and just after each cut:
``campaigns/power.py``), and the anomalies by name: the cuts' (``checks/power.py``) and
the failing checks' anomalies of inconsistent runs (``checks/effects.py`` and others).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from durable_spaces.campaigns.checks.power import log_label, seen
from durable_spaces.chaos.profiles import profile_named


def row(out: Path) -> list[str]:
    meta = json.loads((out / "campaign.json").read_text())["spec"]
    records = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    records = [r for r in records if "." not in r["run_id"]]  # not the exact replays
    cuts: list[dict[str, Any]] = [c for r in records for c in r.get("extra", {}).get("power", [])]
    names: Counter[str] = Counter(n for c in cuts for n in seen(c))
    for r in records:
        for check in r.get("checks", {}).values():
            if check.get("valid") is False:
                names.update(a["name"] for a in check.get("anomalies", []))
        if r["outcome"] == "lab_error":
            names["lab_error"] += 1
    lost = [int(c["lost_commits"]) for c in cuts if c.get("lost_commits") is not None]
    ok = sum(1 for r in records if r["outcome"] == "ok")
    prof = profile_named(meta["profile"])
    per_cut = f"{sum(lost) / len(lost):.1f} (max {max(lost)})" if lost else "-"
    found = ", ".join(f"{k} {v}" for k, v in sorted(names.items())) or "none"
    return [
        log_label(prof.log_synchronous, prof.log_format),
        str(meta["backend"]),
        str(meta["durable_mode"]),
        f"{ok}/{len(records)}",
        str(len(cuts)),
        per_cut,
        found,
    ]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    head = ["log", "backend", "mode", "consistent", "power losses", "commits lost per cut"]
    head.append("anomalies")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for d in argv:
        print("| " + " | ".join(row(Path(d))) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
