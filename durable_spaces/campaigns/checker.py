"""The checker: does the Space's workspace equal what the committed log implies?

Jepsen's shape: each check is a function of the run's history (here, ``Inputs``: the raw
commits of the log, the raw workspace, and what the coordinator and the Space say about
launches and processes) returning ``{"valid": True|False|None, "detail": ...,
"anomalies": [...]}``; ``compose`` runs them all and merges false > unknown > true; a
check that raises counts as unknown instead of crashing the analysis. Each anomaly is
named, as Elle names them, with a witness (``checks.verdict``).

Independence matters: the log is read with ``sqlite3``/``json`` (``checks.rawlog``),
the workspace with the checker's own walk or a tar streamed out of the Space
(``checks.workspace``), and the expected workspace is computed by an interpreter written
here (``checks.workload``), not from the adapter's ``cua.space`` bookkeeping (which is
what is under test). Only ``image_equals_workspace`` and ``image_follows_calls`` read the
adapter's image, ``checkpoint_equals_workspace`` its last checkpoint and
``checkpoint_follows_calls`` every call's, because that is exactly their claim, and each
decodes what it reads itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from durable_spaces.campaigns.checks import (
    call_checkpoints,
    checkpoint,
    effects,
    epochs,
    image,
    processes,
    replay,
    server_survives,
)
from durable_spaces.campaigns.checks.history import History
from durable_spaces.campaigns.checks.inputs import Inputs, LaunchRecord, Workload
from durable_spaces.campaigns.checks.rawlog import read_log
from durable_spaces.campaigns.checks.verdict import Verdict, anomaly, judge, passed
from durable_spaces.campaigns.checks.workspace import HOST_CLOCK_KINDS, snapshot
from durable_spaces.space import Space

__all__ = [
    "CHECKS",
    "History",
    "Inputs",
    "LaunchRecord",
    "Workload",
    "check_all",
    "collect",
    "compose",
    "load_history",
    "merge",
]


def log_intact(inputs: Inputs) -> Verdict:
    """Commits are numbered 1..n without a gap; a torn JSONL tail is reported (a crash
    may leave one; it is not part of the log)."""
    found = [
        anomaly("missing_commit", f"commit {c.seq} follows {prev}", witness=[prev, c.seq])
        for prev, c in zip(
            [0, *(c.seq for c in inputs.log.commits)], inputs.log.commits, strict=False
        )
        if c.seq != prev + 1
    ]
    detail = f"{len(inputs.log.commits)} commits ({inputs.log.format})"
    if inputs.log.torn_tail is not None:
        detail += f"; torn last line ignored: {inputs.log.torn_tail}"
    return judge(found, detail)


def no_error_results(inputs: Inputs) -> Verdict:
    """No result is an error other than ``interrupted``."""
    results = inputs.history.results
    seqs = inputs.history.result_seq
    found = [
        anomaly(
            "error_result",
            f"{r.get('status')}: {str(r.get('content', ''))[:200]!r}",
            witness=[str(r.get("call_id")), seqs.get(str(r.get("call_id")), 0)],
        )
        for r in results
        if r.get("status") not in ("ok", "interrupted")
    ]
    return judge(found, f"{len(results)} results")


def finished(inputs: Inputs) -> Verdict:
    """The run reached its final answer (every scripted step has a result)."""
    done = [
        c.seq
        for c in inputs.log.commits
        for op in c.ops
        if op.get("op") == "submission" and op.get("state") == "done"
    ]
    if done:
        return passed(f"submission done (commit {done[0]})")
    last = inputs.log.commits[-1].seq if inputs.log.commits else 0
    return judge([anomaly("unfinished", "the submission never reached done", witness=[last])], "")


CheckFn = Callable[[Inputs], Verdict]

CHECKS: dict[str, CheckFn] = {
    "log_intact": log_intact,
    "workspace_equals_log": effects.workspace_equals_log,
    "exactly_once": effects.exactly_once,
    "no_error_results": no_error_results,
    "no_stale_writes": epochs.no_stale_writes,
    "image_equals_workspace": image.image_equals_workspace,
    "image_follows_calls": image.image_follows_calls,
    "checkpoint_equals_workspace": checkpoint.checkpoint_equals_workspace,
    "checkpoint_follows_calls": call_checkpoints.checkpoint_follows_calls,
    "finished": finished,
    "same_as_uninterrupted": replay.same_as_uninterrupted,
    "no_leftover_processes": processes.no_leftover_processes,
}


def merge(verdicts: Mapping[str, Verdict]) -> bool | None:
    """false > unknown > true."""
    vals = [v.get("valid") for v in verdicts.values()]
    if any(v is False for v in vals):
        return False
    if any(v is None for v in vals):
        return None
    return True


T = TypeVar("T")


def compose(checks: Mapping[str, Callable[[T], Verdict]]) -> Callable[[T], dict[str, Verdict]]:
    """One function running every check on the same input (``Inputs`` here; a run's
    whole evidence in ``campaigns/evidence.py``), a check that raises counting as
    unknown."""

    def run(inputs: T) -> dict[str, Verdict]:
        out: dict[str, Verdict] = {}
        for name, check in checks.items():
            try:
                v = check(inputs)
            except Exception as e:  # a broken check is unknown, not a crash
                v = {"valid": None, "detail": f"check raised {type(e).__name__}: {e}"}
            v.setdefault("anomalies", [])
            out[name] = v
        return out

    return run


check_all = compose(CHECKS)


async def collect(
    space: Space,
    log_path: str | Path,
    *,
    workload: Workload | None = None,
    launches: list[LaunchRecord] | None = None,
    store: str | Path | None = None,
) -> Inputs:
    """Read everything the checks need: the raw log first (its write time is taken
    before anything opens it), then the workspace and the processes of ``space`` (and
    the ``server`` workload's process), and a checkpoint run's last checkpoint (from
    the Space's copy, else the checkpoint ``store`` directory) and the manifest of every
    checkpoint recorded for a call (the store, else the Space's copy on this host)."""
    log = read_log(log_path)
    kind = (await space.capabilities()).kind
    ws = await snapshot(space)
    history = History.from_log(log)
    serves = workload is not None and workload.server
    procs = await processes.list_processes(space, history.instances(), serves)
    return Inputs(
        log,
        ws,
        workload=workload,
        launches=launches,
        processes=procs,
        host_clock=kind in HOST_CLOCK_KINDS,
        kind=kind,
        server=await server_survives.probe(space) if serves else None,
        checkpoint=await checkpoint.read_last(space, kind, history, store),
        manifests=await call_checkpoints.read_all(space, kind, history, store),
    )


def load_history(log_path: str | Path) -> History:
    """The transcript of a run's log, read raw (the checker is not a writer)."""
    return History.from_log(read_log(log_path))
