"""The power table's rows by what a cut left of the log, from ``log-loss`` campaigns.

    python -m bench.log_loss_table OUT_DIR [OUT_DIR ...]

Each ``OUT_DIR`` is a ``durable-spaces campaign --profile log-loss`` output. A cut of the
log's mount (``campaigns/log_loss.py``) keeps ``all`` of the log, an older ``prefix`` of
it, or ``none``. One Markdown row per campaign and kind of cut that landed: the runs with
such a cut and how many of them were consistent, the cuts, those after which the Space's
ledger or floor was past the log's (``checks/power.py``'s ``space_ahead``), commits lost
per cut (mean and max), and how often the log's witness fired in those runs
(``log_behind`` recoveries, of any cut of the run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from durable_spaces.campaigns.checks.power import log_label
from durable_spaces.chaos.profiles import profile_named

KEPT = {"prefix": "older prefix kept", "none": "every commit lost", "all": "nothing lost"}


def rows(out: Path) -> list[list[str]]:
    meta = json.loads((out / "campaign.json").read_text())["spec"]
    records = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    records = [r for r in records if "." not in r["run_id"]]  # not the exact replays
    prof = profile_named(meta["profile"])
    found = []
    for kept, label in KEPT.items():
        runs: list[dict[str, Any]] = []
        cuts: list[dict[str, Any]] = []
        for r in records:
            mine = [c for c in r.get("extra", {}).get("power", []) if c.get("kept") == kept]
            if mine:
                runs.append(r)
                cuts += mine
        if not cuts:
            continue
        lost = [int(c.get("lost_commits") or 0) for c in cuts]
        ok = sum(1 for r in runs if r["outcome"] == "ok")
        fired = sum(int(r.get("recoveries", {}).get("log_behind", 0)) for r in runs)
        found.append(
            [
                log_label(prof.log_synchronous, prof.log_format),
                label,
                str(meta["backend"]),
                str(meta["durable_mode"]),
                f"{ok}/{len(runs)}",
                str(len(cuts)),
                str(sum(1 for c in cuts if c.get("space_ahead"))),
                f"{sum(lost) / len(lost):.1f} (max {max(lost)})",
                str(fired),
            ]
        )
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    head = ["log", "cut", "backend", "mode", "consistent runs", "cuts", "Space ahead"]
    head += ["commits lost per cut", "log_behind (those runs)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for out in argv:
        for row in rows(Path(out)):
            print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
