"""The probe's own cost and throughput (``python -m bench.probe``).

With a fast harness (bench/probe_agent.py: urllib, no SDK), prints the time the lab adds
to each run beyond the harness's own processes (a run's wall time minus its attempts'),
at p50/p95/max over uninterrupted and killed runs, and how many runs of a ``--steps``-step
probe it makes a minute with ``--jobs`` in parallel.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

from durable_spaces.campaigns.summary import percentile
from durable_spaces.probe.recipe import load
from durable_spaces.probe.whole_probe import ProbeSpec, run_probe

AGENT = Path(__file__).resolve().parent / "probe_agent.py"


def recipe_file(d: Path) -> Path:
    p = d / "recipe.toml"
    p.write_text(
        'name = "bench-fast"\n'
        f'launch = ["{sys.executable}", "-S", "{AGENT}", "{{model_url}}", "{{state_dir}}", '
        '"{prompt}"]\n'
        "timeout_s = 60\n"
        '[tool]\nname = "bash"\nargument = "command"\n'
    )
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--fault", default="process")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        recipe = load(str(recipe_file(Path(tmp))))
        spec = ProbeSpec(recipe=recipe, out=Path(tmp) / "out", runs=a.runs, steps=a.steps,
                         jobs=a.jobs, fault=a.fault, seed_base="bench")  # fmt: skip
        t0 = time.monotonic()
        result = run_probe(spec, stdout=io.StringIO())
        wall = time.monotonic() - t0
    lab = [r.duration_ms - r.harness_ms for r in result.records]
    p50, p95 = percentile(lab, 50), percentile(lab, 95)
    print(result.summary)
    print(f"lab overhead per run: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {max(lab):.1f} ms "
          f"({len(lab)} runs, {a.steps} steps, fault {a.fault})")  # fmt: skip
    print(f"throughput: {len(result.records) / wall * 60:.1f} runs/min "
          f"({len(result.records)} runs in {wall:.1f} s, {a.jobs} jobs)")  # fmt: skip


if __name__ == "__main__":
    main()
