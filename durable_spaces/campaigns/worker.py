"""One campaign run in a process of its own: ``python -m durable_spaces.campaigns.worker``.

The runner starts one worker per run, so runs share nothing (no module state, no
failpoint counters, no event loop) and a run that wedges or dies takes only itself down.
Arguments: ``RUN_ONE`` (``module:function``, an async or plain ``RunSpec -> RunRecord``),
``SPEC`` (a RunSpec JSON file), ``OUT`` (where the RunRecord JSON goes). A run that
raises is written as an ``error`` record with the traceback's tail.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_spaces.campaigns.record import Check, RunRecord
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.chaos import failpoints


def resolve(ref: str) -> Callable[[RunSpec], Any]:
    """``module:function`` (dotted attribute path allowed after the colon)."""
    mod_name, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def error_record(spec: RunSpec, detail: str, duration_s: float = 0.0) -> RunRecord:
    return RunRecord(
        run_id=spec.run_id,
        seed=spec.seed,
        mode=spec.mode,
        backend=spec.backend,
        calls=spec.calls,
        schedule=None if spec.schedule is None else spec.schedule.to_json(),
        outcome="lab_error",
        checks={"run": Check(valid=None, detail=detail[-2000:])},
        duration_s=duration_s,
        durable_mode=spec.durable_mode,
        scenario=spec.scenario,
    )


def execute(ref: str, spec: RunSpec) -> RunRecord:
    """Run ``spec`` through ``ref`` in this process; never raises for the run's sake."""
    failpoints.arm("")  # the worker itself is never a kill target
    t0 = time.monotonic()
    try:
        out = resolve(ref)(spec)
        if inspect.isawaitable(out):

            async def wait() -> Any:
                return await out

            out = asyncio.run(wait())
        if not isinstance(out, RunRecord):
            raise TypeError(f"{ref} returned {type(out).__name__}, not a RunRecord")
        rec = out
    except Exception:
        return error_record(spec, traceback.format_exc(), time.monotonic() - t0)
    if not rec.duration_s:
        rec.duration_s = time.monotonic() - t0
    return rec


def main(argv: list[str] | None = None) -> int:
    ref, spec_path, out_path = argv if argv is not None else sys.argv[1:]
    spec = RunSpec.from_json(json.loads(Path(spec_path).read_text()))
    rec = execute(ref, spec)
    out = Path(out_path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(rec.to_json(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
