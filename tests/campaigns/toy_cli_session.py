"""A stand-in for ``durable_spaces.campaigns.run`` in CLI tests."""

from __future__ import annotations

from pathlib import Path

from durable_spaces.campaigns.record import Check, RunRecord
from durable_spaces.campaigns.spec import CampaignSpec, RunSpec
from durable_spaces.chaos.schedule import Schedule, exhaustive


async def run_one(run: RunSpec) -> RunRecord:
    """Fails on seed ``<base>-1`` and on any exhaustive kill at ``commit``; the record's
    ``extra["spec"]`` is the RunSpec it was given (how the CLI's options became a run)."""
    sched = run.schedule or Schedule.draw(run.seed, ["call"], run.calls)
    bad = (run.schedule is None and run.seed.endswith("-1")) or any(
        a.failpoint is not None and a.failpoint.name == "commit" for a in sched.attempts
    )
    return RunRecord(
        run.run_id,
        run.seed,
        run.mode,
        run.backend,
        run.calls,
        schedule=sched.to_json(),
        kills=sched.planned_kills,
        checks={"exactly_once": Check(valid=not bad, detail="")},
        extra={"spec": run.to_json()},
    ).settle()


def exhaustive_schedules(spec: CampaignSpec, work_dir: Path) -> list[Schedule]:
    work_dir.mkdir(parents=True, exist_ok=True)
    trace = work_dir / "trace.txt"
    trace.write_text("".join(f"call {i}\ncommit {i}\n" for i in range(1, spec.calls + 1)))
    return exhaustive(trace, spec.seed_base)
