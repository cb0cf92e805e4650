"""Campaign throughput and resume latency (``python -m bench.campaign``).

Runs short real campaigns (kill-heavy profile) per mode and backend and prints runs per
minute on this machine, and the resume latency after a driver kill (kill -> the next
driver's first step) at p50/p95, with the coordinator's backoff excluded.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time

from durable_spaces.backends import unavailable_reason
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.runner import run_campaign
from durable_spaces.campaigns.spec import CampaignSpec
from durable_spaces.campaigns.summary import percentile

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backends", default="local,spacesd")
    ap.add_argument("--modes", default="transactional,checkpoint")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    print(f"campaign bench: {a.runs} runs x {a.calls} calls, {a.jobs} jobs, profile kills")
    print(f"{'backend':9} {'mode':14} {'runs/min':>9} {'ok':>6} {'kills':>6} "
          f"{'resume p50':>11} {'p95':>7}  (ms, backoff excluded)")  # fmt: skip
    for backend in a.backends.split(","):
        why = unavailable_reason(backend)
        if why:
            print(f"{backend:9} skipped: {why}")
            continue
        for mode in a.modes.split(","):
            spec = CampaignSpec(
                mode=mode, backend=backend, seed_base=f"bench-{mode}", runs=a.runs,
                calls=a.calls, jobs=a.jobs, profile="kills",
            )  # fmt: skip
            with tempfile.TemporaryDirectory() as out:
                t0 = time.monotonic()
                result = run_campaign(
                    spec, "durable_spaces.campaigns.run:run_one", out_dir=out,
                    progress=False, stdout=io.StringIO(),
                )  # fmt: skip
                wall = time.monotonic() - t0
            recs: list[RunRecord] = list(result.records)
            lat = [
                max(0.0, x - b)
                for r in recs
                for x, b in zip(r.resume_latencies_ms, r.resume_backoffs_ms, strict=False)
            ]
            ok = sum(1 for r in recs if r.outcome == "ok")
            kills = sum(r.kills for r in recs)
            p50 = percentile(lat, 50) or float("nan")
            p95 = percentile(lat, 95) or float("nan")
            print(f"{backend:9} {mode:14} {len(recs) / wall * 60:9.1f} {ok:>3}/{len(recs):<2} "
                  f"{kills:>6} {p50:11.0f} {p95:7.0f}")  # fmt: skip
            if lat:
                print(f"{'':25} mean {statistics.mean(lat):.0f} ms over {len(lat)} resumes")


if __name__ == "__main__":
    main()
