"""The determinism campaign: K seeds run twice each, through the campaign runner's runs
(``runner.py``), and how many realized the same interleaving both times
(``replay.differences``). ``durable-spaces campaign --determinism K`` prints its line."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from durable_spaces.campaigns import earned
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.replay import differences
from durable_spaces.campaigns.runner import RunOneRef, _check_args, _Runs, run_one_ref
from durable_spaces.campaigns.spec import CampaignSpec, RunSpec
from durable_spaces.campaigns.summary import Summary, emit
from durable_spaces.errors import ConfigError


@dataclass
class Determinism:
    """K seeds run twice each: how many realized the same interleaving both times."""

    seeds: int
    same: int
    profile: str
    differences: dict[str, list[str]] = field(default_factory=dict)
    #: Why the runs tested less than they planned (``campaigns/earned.py``), or None.
    untested: str | None = None
    #: What the runs alone exit with (``earned.exit_code``: 1, 3, 4 or 0).
    runs_code: int = 0

    @property
    def fraction(self) -> float:
        return self.same / self.seeds if self.seeds else 1.0

    def line(self) -> str:
        return (
            f"DETERMINISM seeds={self.seeds} same={self.same} "
            f"fraction={self.fraction:.3f} profile={self.profile}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "seeds": self.seeds,
            "same": self.same,
            "fraction": self.fraction,
            "profile": self.profile,
            "differences": self.differences,
            "untested": self.untested,
        }

    @property
    def exit_code(self) -> int:
        """1 if a pair parted (or a run failed), 3 the lab broke one, 4 untested, else 0."""
        return earned.EXIT_FAILED if self.same != self.seeds else self.runs_code


def run_determinism(
    spec: CampaignSpec,
    run_one: RunOneRef,
    seeds: int,
    *,
    out_dir: str | Path,
    jobs: int | None = None,
    run_timeout_s: float | None = 900.0,
    stdout: IO[str] | None = None,
) -> Determinism:
    """Run seeds ``<seed_base>-0 .. K-1`` twice each and compare the two realized
    interleavings (``campaigns/replay.py``'s signature); writes ``determinism.json`` and
    the records of both runs under ``runs/`` (``<run>.a``, ``<run>.b``). Prints the
    DETERMINISM line, a PARTED line per pair that parted, an UNTESTED line if the runs
    tested less than they planned, and the SUMMARY line of all the runs last."""
    if not 1 <= seeds <= 10_000:
        raise ConfigError(f"--determinism must be between 1 and 10000 seeds, not {seeds}")
    out = _check_args(out_dir, jobs, run_timeout_s, 40)
    for sub in ("runs", "logs", "state"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    runs = _Runs(run_one_ref(run_one), out, run_timeout_s, spec.lab)
    state_root = str(out / "state")
    pairs = [
        [spec.run(i, state_root).with_(run_id=f"run-{i:04d}.{t}",
                                        state_dir=os.path.join(state_root, f"run-{i:04d}.{t}"))
         for t in ("a", "b")]
        for i in range(seeds)
    ]  # fmt: skip

    async def all_runs() -> list[RunRecord]:
        sem = asyncio.Semaphore(jobs or spec.jobs)

        async def one(rs: RunSpec) -> RunRecord:
            async with sem:
                rec = await runs.run(rs)
            rec.save(out / "runs")
            return rec

        async with runs.warm(jobs or spec.jobs, 2 * seeds):
            return list(await asyncio.gather(*(one(rs) for pair in pairs for rs in pair)))

    with runs.zygote():
        recs = asyncio.run(all_runs())
    untested = earned.campaign_shortfall(recs, spec)
    result = Determinism(seeds, 0, spec.profile, untested=untested,
                         runs_code=earned.exit_code(recs, untested))  # fmt: skip
    for i in range(seeds):
        a, b = recs[2 * i], recs[2 * i + 1]
        diff = differences(a, b)
        if diff:
            result.differences[f"run-{i:04d}"] = diff
        else:
            result.same += 1
    (out / "determinism.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    w = stdout if stdout is not None else sys.stdout
    emit(w, result.line())
    for run, diff in result.differences.items():  # where each pair parted, and its records
        emit(w, f"PARTED {run}: {'; '.join(diff)} ({out / 'runs' / run}.a.json, .b.json)")
    if result.untested is not None:
        emit(w, f"UNTESTED {result.untested}")
    # Last, as a campaign's: every run of both passes (what .ci/lib.sh reads).
    summary = Summary.of(recs, mode=spec.mode, backend=spec.backend, seed_base=spec.seed_base)
    emit(w, summary.line())
    return result
