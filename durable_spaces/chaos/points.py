"""Every failpoint name, once: the constants product code hits, grouped, with what each means.

A failpoint (``chaos/failpoints.py``) is hit right *after* the step its name describes, so
a kill there is a crash between that step and the next one. The lab draws kills, pauses
and rendezvous among these names; a name that is not here is a typo, and
``tests/chaos/test_points.py`` fails on any ``hit("...")`` in ``durable_spaces/`` that
names one (string literals stay in the files that other helpers edit; they are checked
against this list instead of importing it).

``timer`` marks a point hit from a timer (``hit(..., timer=True)``): whether it is hit at
all depends on how fast a command ran, so it is never a logical position of a run.
``also_timer`` marks one hit both ways: its n-th hit depends on timing too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    name: str
    group: str
    meaning: str
    #: Hit only from a timer (never counted as a logical hit).
    timer: bool = False
    #: Hit from a timer as well as at a logical position (``tests/chaos/test_points.py``
    #: reads which from the code and holds this to it).
    also_timer: bool = False
    #: Why a kill of the process that passes it makes no sense (empty: it does). An
    #: exhaustive campaign kills at every hit of every other point a run passes.
    not_killable: str = ""


REGISTRY: dict[str, Point] = {}


def _point(
    name: str,
    group: str,
    meaning: str,
    *,
    timer: bool = False,
    also_timer: bool = False,
    not_killable: str = "",
) -> str:
    if name in REGISTRY:
        raise ValueError(f"failpoint {name!r} registered twice")
    REGISTRY[name] = Point(name, group, meaning, timer, also_timer, not_killable)
    return name


# --- the adapter's call path (durable_spaces/adapter/calls.py, durable.py) ---------------
ADAPTER = "adapter"
ADAPTER_CALL = _point("adapter.call", ADAPTER, "a call the log has no record of begins")
ADAPTER_START_MARK = _point(
    "adapter.start_mark", ADAPTER, "the call's start (its before-state) is committed"
)
ADAPTER_SPAWN = _point("adapter.spawn", ADAPTER, "the command was spawned under its ledger key")
ADAPTER_RUNNING = _point(
    "adapter.running", ADAPTER, "the command still runs a moment after its start", timer=True
)
ADAPTER_MID_CALL = _point(
    "adapter.mid_call",
    ADAPTER,
    "the effect may have happened and is not recorded yet",
    also_timer=True,  # a write's or edit's after its effect; a command's while it runs
)
ADAPTER_EXIT = _point("adapter.exit", ADAPTER, "the command exited; its outcome is not committed")
ADAPTER_BEFORE_FILE_OP = _point(
    "adapter.before_file_op", ADAPTER, "a write or edit is about to change the Space"
)
ADAPTER_FILE_OP = _point(
    "adapter.file_op", ADAPTER, "a write or edit changed the Space; its outcome is not committed"
)
ADAPTER_OUTCOME_COMMIT = _point(
    "adapter.outcome_commit", ADAPTER, "the call's outcome (and image update) is committed"
)
ADAPTER_CHECKPOINT = _point(
    "adapter.checkpoint", ADAPTER, "the checkpoint after the call exists, the log does not say so"
)

# --- recovery: a resumed call, a Space brought back to the log ---------------------------
RECOVERY = "recovery"
RECOVERY_START = _point("recovery.start", RECOVERY, "a resumed call found its record")
RECOVERY_REVERTED = _point(
    "recovery.reverted", RECOVERY, "a call of unknown outcome was reverted to its before-image"
)
RECOVERY_QUARANTINED = _point(
    "recovery.quarantined",
    RECOVERY,
    "what a take-back would delete is in a quarantine checkpoint, recorded; nothing deleted yet",
)
RECOVERY_RESTORED = _point(
    "recovery.restored", RECOVERY, "a checkpoint was restored (before the call, or the last)"
)
RECOVERY_REIMAGED = _point(
    "recovery.reimaged", RECOVERY, "a Space placed again was rebuilt from the log's image"
)
IMAGE_APPLY_OP = _point(
    "image.apply_op", RECOVERY, "one change towards the log's image is next (revert, reimage)"
)
SNAPSHOTS_RESTORE = _point(
    "snapshots.restore", RECOVERY, "a checkpoint restore is about to land in the Space"
)
CHECKPOINT_STORE_PRUNE = _point(
    "checkpoint_store.prune", RECOVERY, "a store prune removed manifests, not yet their blobs"
)

# --- the harness (durable_spaces/harness/scheduler.py) -----------------------------------
HARNESS = "harness"
HARNESS_ADMIT = _point("harness.admit", HARNESS, "a submission is committed as active")
HARNESS_GENERATED = _point(
    "harness.generated", HARNESS, "the model answered; the answer is not committed"
)
HARNESS_INTENT = _point("harness.intent", HARNESS, "an answer with tool calls is committed")
HARNESS_ANSWER = _point("harness.answer", HARNESS, "a final answer (no tool calls) is committed")
HARNESS_TOOL_INTERRUPTED = _point(
    "harness.tool_interrupted", HARNESS, "a resumed unsafe tool call was committed interrupted"
)
HARNESS_TOOL_RUNNING = _point(
    "harness.tool_running", HARNESS, "a tool task is committed running, the tool not called"
)
HARNESS_TOOL_RETURNED = _point(
    "harness.tool_returned", HARNESS, "the tool returned; its result is not committed"
)
HARNESS_TOOL_RESULT = _point("harness.tool_result", HARNESS, "the tool's result is committed")
HARNESS_OUTPUT = _point("harness.output", HARNESS, "a tool's streamed output was committed")

# --- the log (durable_spaces/harness/log_sqlite.py, log_jsonl.py) ------------------------
LOG = "log"
LOG_BEFORE_COMMIT = _point("log.before_commit", LOG, "a commit is written, not yet durable")
LOG_SHORT_WRITE = _point("log.short_write", LOG, "a JSONL commit line is half written")
LOG_AFTER_COMMIT = _point("log.after_commit", LOG, "a commit is durable")

# --- Space backends (durable_spaces/backends/) -------------------------------------------
SPACE = "space"
SPACE_MUTATE = _point("space.mutate", SPACE, "a fenced file operation is issued to the Space")
SPACE_MUTATE_STARTED = _point(
    "space.mutate_started", SPACE, "a file operation runs in the Space, its bytes not sent"
)
SPACE_LOCAL_LEDGER_WRITTEN = _point(
    "space.local.ledger_written", SPACE, "local: the exec ledger holds the key, nothing runs"
)
SPACE_LOCAL_SERVER_STARTED = _point(
    "space.local.server_started", SPACE, "local: the Space's fork server listens, is recorded"
)
SPACE_LOCAL_SERVER_FORKED = _point(
    "space.local.server_forked", SPACE, "local: the fork server forked a supervisor (in it)"
)
SPACE_LOCAL_FORKED = _point(
    "space.local.forked", SPACE, "local: a forked supervisor answered, is not recorded"
)
SPACE_LOCAL_SUPERVISOR_RECORDED = _point(
    "space.local.supervisor_recorded", SPACE, "local: the supervisor is recorded, not started"
)
SPACE_LOCAL_SPAWNED = _point("space.local.spawned", SPACE, "local: the command's supervisor runs")

# --- the coordinator (durable_spaces/drive/coordinator_state.py, coordinator.py) -----
COORDINATOR = "coordinator"
COORDINATOR_EPOCH_ISSUED = _point(
    "coordinator.epoch_issued", COORDINATOR, "the next epoch is durable, no driver spawned yet"
)
COORDINATOR_DRIVER_RECORDED = _point(
    "coordinator.driver_recorded", COORDINATOR, "the spawned driver's pid is in the state file"
)

# --- microVMs (durable_spaces/backends/microvm/) -----------------------------------------
MICROVM = "microvm"
MICROVM_START_SPAWNED = _point(
    "microvm.start.spawned", MICROVM, "QEMU runs; the machine is not recorded yet"
)
MICROVM_START_LAUNCHED = _point(
    "microvm.start.launched", MICROVM, "the machine is recorded, not answering yet"
)
MICROVM_START_RESUMED = _point(
    "microvm.start.resumed", MICROVM, "a restored machine answers, not yet raised to the floor"
)
MICROVM_CHECKPOINT_STOPPED = _point(
    "microvm.checkpoint.stopped", MICROVM, "the machine is stopped for a checkpoint"
)
MICROVM_CHECKPOINT_SNAPSHOT = _point(
    "microvm.checkpoint.snapshot", MICROVM, "the disk snapshot is taken, the memory not saved"
)

GROUPS = (ADAPTER, RECOVERY, HARNESS, LOG, SPACE, COORDINATOR, MICROVM)
#: Points hit only from a timer: never a logical position for a drawn fault.
TIMER_ONLY = frozenset(p.name for p in REGISTRY.values() if p.timer)
#: Points how many times a run passes depends on timing (hit from a timer, only or too):
#: a failpoint at the n-th hit of one lands in different places run to run.
TIMED = frozenset(p.name for p in REGISTRY.values() if p.timer or p.also_timer)
#: Points a kill at makes no sense, and why (``Point.not_killable``).
NOT_KILLABLE = {p.name: p.not_killable for p in REGISTRY.values() if p.not_killable}


def known(name: str) -> bool:
    return name in REGISTRY


def unknown(names: Iterable[str]) -> list[str]:
    """The names among ``names`` that are not registered."""
    return sorted(set(names) - set(REGISTRY))


def check(names: Iterable[str], what: str) -> None:
    """``ValueError`` naming ``what`` if a name in ``names`` is not a registered point
    (lists derived by hand, e.g. the campaign's kill points, are checked at import)."""
    bad = unknown(names)
    if bad:
        raise ValueError(f"{what} names unregistered failpoints: {', '.join(bad)}")


__all__ = [
    "GROUPS",
    "NOT_KILLABLE",
    "REGISTRY",
    "TIMED",
    "TIMER_ONLY",
    "Point",
    "check",
    "known",
    "unknown",
]
