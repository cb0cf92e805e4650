"""One campaign run in a process of its own: ``python -m durable_spaces.campaigns.worker``.

The runner starts one worker per run, so runs share nothing (no module state, no
failpoint counters, no event loop) and a run that wedges or dies takes only itself down.
Arguments: ``RUN_ONE`` (``module:function``, an async or plain ``RunSpec -> RunRecord``),
``SPEC`` (a RunSpec JSON file), ``OUT`` (where the RunRecord JSON goes). A run that
raises is written as an ``error`` record with the traceback's tail.

A *spare* worker (``python -m durable_spaces.campaigns.worker --spare RUN_ONE``, started
by the runner before its run exists: ``campaigns/worker_spares.py``) imports
``RUN_ONE``'s module and waits; one JSON line on stdin, ``{"spec": SPEC, "out": OUT,
"log": LOG}``, makes it exactly the worker above with stdout and stderr appended to
``LOG`` (what the runner gives a cold worker). It does nothing else before that line (no
run's state, no failpoint armed), so runs still share nothing; end of file before the
line ends it with exit 0, a line it cannot read with exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
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

from durable_spaces.campaigns.fast_exit import exit_now
from durable_spaces.campaigns.record import Check, RunRecord
from durable_spaces.campaigns.spec import LabSettings, RunSpec
from durable_spaces.chaos import failpoints
from durable_spaces.host.bounded import load_object, parse_json


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


def _spare(ref: str) -> int:
    """Import ``ref``'s module, then wait for the run (see the module doc)."""
    with contextlib.suppress(Exception):  # a failure comes again in execute(), recorded
        resolve(ref)
    raw = sys.stdin.buffer.readline()
    if not raw:
        return 0  # the runner closed its spares: never launched
    try:
        msg = parse_json(raw, where="the launch line")
        if not isinstance(msg, dict) or set(msg) != {"spec", "out", "log"}:
            raise ValueError("expected exactly the keys spec, out, log")
        spec_path, out_path, log_path = (str(msg[k]) for k in ("spec", "out", "log"))
    except ValueError as e:
        print(f"campaign worker: bad launch line: {e}", file=sys.stderr)
        return 2
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    sys.stdout.flush()
    sys.stderr.flush()
    for src, dst in ((fd, 1), (fd, 2), (null, 0)):
        os.dup2(src, dst)
    os.close(fd)
    os.close(null)
    print("campaign worker: warm", file=sys.stderr, flush=True)
    return main([ref, spec_path, out_path])


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) == 2 and args[0] == "--spare":
        return _spare(args[1])
    ref, spec_path, out_path = args
    spec = RunSpec.from_json(load_object(spec_path))
    rec = execute(ref, spec)
    out = Path(out_path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(rec.to_json(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    lab = LabSettings.from_env()  # this process's edge (the campaign checked them first)
    exit_now(main(), lab.fast_exit)  # campaigns/fast_exit.py: no teardown to wait for
