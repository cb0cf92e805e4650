"""Everything a check may look at, gathered once per run: ``Inputs``.

The raw log and the raw workspace always; the rest when the caller knows it: the
workload's parameters (for the replay), the coordinator's launch history (for the epoch
checks), a listing of the Space's processes, whether the Space's file times come from
this host's clock (for stale writes), and the ``server`` workload's process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from durable_spaces.campaigns.checks.call_checkpoints import Manifests
from durable_spaces.campaigns.checks.checkpoint import LastCheckpoint
from durable_spaces.campaigns.checks.history import History
from durable_spaces.campaigns.checks.rawlog import RawLog
from durable_spaces.campaigns.checks.workload import Implied, interpret
from durable_spaces.campaigns.checks.workspace import Workspace
from durable_spaces.harness.models import check_gate


@dataclass(frozen=True)
class Workload:
    """The scripted agent's parameters (``agent.json``): enough to replay it."""

    seed: str
    calls: int
    sleep: float = 0.0
    server: bool = False
    files: int = 4
    gate: str | None = None  # the file its commands wait for (``ScriptedModel``'s gate)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Workload:
        return Workload(
            seed=str(d["seed"]),
            calls=int(d["calls"]),
            sleep=float(d.get("sleep") or 0.0),
            server=bool(d.get("server")),
            files=int(d.get("files") or 4),
            gate=check_gate(str(d["gate"])) if d.get("gate") else None,
        )


@dataclass(frozen=True)
class LaunchRecord:
    """One driver the coordinator launched: its epoch, pid, and how it ended."""

    epoch: int
    pid: int | None = None
    unix_ms: float | None = None
    done_ms: float | None = None  # its ``done`` event (after its last commit)
    exit_code: int | None = None

    @staticmethod
    def from_events(events: Iterable[Mapping[str, Any]]) -> list[LaunchRecord]:
        """Launches from coordinator events (``launch``, ``driver_event`` ``done``,
        ``exit``), in order; later events of an epoch belong to its latest launch."""
        rows: list[dict[str, Any]] = []
        latest: dict[int, dict[str, Any]] = {}
        for ev in events:
            kind, epoch = ev.get("event"), ev.get("epoch")
            if not isinstance(epoch, int):
                continue
            if kind == "launch":
                row = {"epoch": epoch, "pid": ev.get("pid"), "unix_ms": ev.get("unix_ms")}
                rows.append(row)
                latest[epoch] = row
            elif epoch in latest and kind == "exit":
                latest[epoch]["exit_code"] = ev.get("code")
            elif epoch in latest and kind == "driver_event":
                data = ev.get("data") or {}
                if data.get("event") == "done":
                    latest[epoch]["done_ms"] = data.get("unix_ms") or ev.get("unix_ms")
        return [LaunchRecord(**r) for r in rows]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    cmd: str


@dataclass(frozen=True)
class ProcessListing:
    """What ran in the Space when the run ended.

    ``method``: ``mark`` (local: host processes carrying one of the Space's instance
    marks; every one is a leftover) or ``namespace`` (a listing of ``/proc`` from inside
    the Space by the command ``probe``; its own tree, its ancestors and kernel threads
    are not the workload's). ``unknown`` says why nothing could be listed.
    """

    method: str
    procs: tuple[Proc, ...] = ()
    probe: int | None = None
    server_pid: int | None = None
    unknown: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["procs"] = [asdict(p) for p in self.procs]
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ProcessListing:
        return ProcessListing(
            method=str(d["method"]),
            procs=tuple(Proc(int(p["pid"]), int(p["ppid"]), str(p["cmd"])) for p in d["procs"]),
            probe=d.get("probe"),
            server_pid=d.get("server_pid"),
            unknown=d.get("unknown"),
        )


@dataclass(frozen=True)
class ServerProbe:
    """The ``server`` workload's process as a probe in the Space saw it after the run:
    the probe's exit code and output (``<pid> <seconds since its last beat>``)."""

    exit_code: int | None  # None: the probe did not exit (killed by a signal)
    output: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ServerProbe:
        code = d.get("exit_code")
        return ServerProbe(None if code is None else int(code), str(d["output"]))


@dataclass
class Inputs:
    log: RawLog
    workspace: Workspace
    workload: Workload | None = None
    launches: list[LaunchRecord] | None = None
    processes: ProcessListing | None = None
    #: The Space's file times come from this host's clock (local, spacesd, docker).
    host_clock: bool = False
    kind: str = ""
    notes: list[str] = field(default_factory=list)
    #: The ``server`` workload's process after the run (None: not a server run).
    server: ServerProbe | None = None
    #: A checkpoint run's last checkpoint as the Space's copy held it (None: not one).
    checkpoint: LastCheckpoint | None = None
    #: The manifest of every checkpoint the log recorded for a call (None: not read).
    manifests: Manifests | None = None

    @cached_property
    def history(self) -> History:
        return History.from_log(self.log)

    @cached_property
    def implied(self) -> Implied:
        return interpret(self.history)

    @cached_property
    def status(self) -> dict[str, str]:
        """call id -> the status of its first committed result."""
        out: dict[str, str] = {}
        for r in self.history.results:
            out.setdefault(str(r.get("call_id")), str(r.get("status")))
        return out
