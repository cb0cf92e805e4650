"""The run record: one campaign run as data, from its seed to its verdict.

Written as ``<campaign>/runs/<run_id>.json``; the SUMMARY line and the reports are
computed from these files alone. Checks merge as in Jepsen: a single ``False`` makes the
run invalid, otherwise a single ``None`` (unknown: the checker could not tell, or raised)
makes it unknown, otherwise it is valid.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NotRequired, TypedDict

OUTCOMES = ("ok", "failed", "error")


class Check(TypedDict):
    """One checker's verdict: ``valid`` True, False, or None (unknown), and the named
    anomalies that make it false (``{"name", "path", "witness", "detail"}``; records
    written before anomalies existed have none)."""

    valid: bool | None
    detail: str
    anomalies: NotRequired[list[dict[str, Any]]]


def _check(c: Mapping[str, Any]) -> Check:
    check = Check(valid=c.get("valid"), detail=str(c.get("detail", "")))
    anomalies = c.get("anomalies")
    if isinstance(anomalies, list):
        check["anomalies"] = [dict(a) for a in anomalies if isinstance(a, Mapping)]
    return check


def merge_valid(values: Iterable[bool | None]) -> bool | None:
    """Jepsen's merge: false > unknown > true (nothing to check is valid)."""
    result: bool | None = True
    for v in values:
        if v is False:
            return False
        if v is None:
            result = None
    return result


@dataclass
class RunRecord:
    """One run. ``outcome``: ok (every check valid), failed (a check is not valid),
    error (the run itself broke: a harness bug, a timeout; its checks may be empty)."""

    run_id: str
    seed: str
    mode: str
    backend: str
    calls: int
    schedule: dict[str, Any] | None = None
    faults: dict[str, int] = field(default_factory=dict)
    kills: int = 0
    recoveries: dict[str, int] = field(default_factory=dict)
    attempts: int = 0
    resume_latencies_ms: list[float] = field(default_factory=list)
    #: Backoff slept inside each resume (same order; empty if not recorded), so a
    #: report can show the latency with the backoff excluded.
    resume_backoffs_ms: list[float] = field(default_factory=list)
    outcome: str = "ok"
    checks: dict[str, Check] = field(default_factory=dict)
    duration_s: float = 0.0
    repro: str = ""
    durable_mode: str | None = None
    #: Free-form extras (epochs, exit codes, coordinator status, notes).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool | None:
        return merge_valid(c["valid"] for c in self.checks.values())

    def settle(self) -> RunRecord:
        """Set ``outcome`` from the checks (an ``error`` outcome is kept)."""
        if self.outcome != "error":
            self.outcome = "ok" if self.valid is True else "failed"
        return self

    def failing_checks(self) -> list[str]:
        return sorted(k for k, c in self.checks.items() if c["valid"] is not True)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> RunRecord:
        known = {f.name for f in fields(RunRecord)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["checks"] = {k: _check(c) for k, c in dict(d.get("checks") or {}).items()}
        return RunRecord(**kw)

    def save(self, directory: str | Path) -> Path:
        """Write ``<directory>/<run_id>.json`` atomically."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{self.run_id}.json"
        tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
        return path

    @staticmethod
    def load(path: str | Path) -> RunRecord:
        return RunRecord.from_json(json.loads(Path(path).read_text()))


def load_records(campaign_dir: str | Path) -> list[RunRecord]:
    """Every ``runs/*.json`` of a campaign directory, in run-id order."""
    runs = Path(campaign_dir) / "runs"
    return [RunRecord.load(p) for p in sorted(runs.glob("*.json"))]
