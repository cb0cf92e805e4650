"""A stand-in for ``durable_spaces.campaigns.run`` that reports the RunSpec it was given
(CLI tests of how options become a run)."""

from __future__ import annotations

from durable_spaces.campaigns.record import Check, RunRecord
from durable_spaces.campaigns.spec import RunSpec


async def run_one(run: RunSpec) -> RunRecord:
    return RunRecord(
        run.run_id,
        run.seed,
        run.mode,
        run.backend,
        run.calls,
        checks={"ok": Check(valid=True, detail="")},
        durable_mode=run.durable_mode,
        scenario=run.scenario,
        extra={"spec": run.to_json()},
    ).settle()
