"""The run record: one campaign run as data, from its seed to its verdict.

Written as ``<campaign>/runs/<run_id>.json``; the SUMMARY line and the reports are
computed from these files alone. Checks merge as in Jepsen: a single ``False`` makes the
run invalid, otherwise a single ``None`` (unknown: the checker could not tell, or raised)
makes it unknown, otherwise it is valid.

A record file is read as data from outside: ``from_json`` checks every field's type
(``RecordError`` naming the file and the field), and ``scan_records`` skips a file that
is not a record instead of failing a whole report.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from durable_spaces.errors import BadFileError, RecordError
from durable_spaces.host.bounded import load_json

OUTCOMES = ("ok", "failed", "lab_error")
#: Outcome names older records used (read as the current name).
_OLD_OUTCOMES = {"error": "lab_error"}
#: A run id names its record file: one safe word (no "/", no "..").
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
#: Fault and recovery kinds go into the SUMMARY line as ``name:count``.
_COUNT_NAME_RE = re.compile(r"[^\s=,:]+")
#: Larger than any record the runner writes; a bigger file is not read whole.
MAX_RECORD_BYTES = 16 << 20


class Check(TypedDict):
    """One checker's verdict: ``valid`` True, False, or None (unknown), and the named
    anomalies that make it false (``{"name", "path", "witness", "detail"}``; records
    written before anomalies existed have none)."""

    valid: bool | None
    detail: str
    anomalies: NotRequired[list[dict[str, Any]]]
    #: How many things (calls, paths) the check compared; absent in older records.
    verified: NotRequired[int]


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
    """One run. ``outcome``: ok (every check valid), failed (a check about the system
    under test is not valid), lab_error (the lab itself broke: a bug or a timeout of
    the harness, a fault of the lab's that could not be settled; its checks may be empty
    and it says nothing about the adapter)."""

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
    #: How the run was driven (``campaigns/scenarios/``); None in records from before
    #: scenarios had a name (their ``mode`` then names it, or it was ``random``).
    scenario: str | None = None

    @property
    def valid(self) -> bool | None:
        return merge_valid(c["valid"] for c in self.checks.values())

    def settle(self) -> RunRecord:
        """Set ``outcome`` from the checks (a ``lab_error`` outcome is kept)."""
        if self.outcome != "lab_error":
            self.outcome = "ok" if self.valid is True else "failed"
        return self

    def failing_checks(self) -> list[str]:
        return sorted(k for k, c in self.checks.items() if c["valid"] is not True)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Any) -> RunRecord:
        """A record from its JSON form; ``RecordError`` names the first bad field
        (unknown fields are ignored, so newer records still read)."""
        if not isinstance(d, Mapping):
            raise RecordError(f"a run record is a JSON object, not {type(d).__name__}")
        for name in ("run_id", "seed", "mode", "backend", "calls"):
            if name not in d:
                raise RecordError(f"field {name!r} is missing")
        kw: dict[str, Any] = {}
        for f in fields(RunRecord):
            if f.name in d:
                kw[f.name] = _FIELD_CHECKS.get(f.name, _any)(f.name, d[f.name])
        if not RUN_ID_RE.fullmatch(kw["run_id"]):
            raise RecordError(f"field 'run_id' is not a safe file name: {kw['run_id']!r}")
        return RunRecord(**kw)

    def save(self, directory: str | Path) -> Path:
        """Write ``<directory>/<run_id>.json`` atomically (never through a symlink)."""
        if not RUN_ID_RE.fullmatch(self.run_id):
            raise RecordError(f"run id {self.run_id!r} is not a safe file name")
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{self.run_id}.json"
        tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
        data = (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()
        tmp.unlink(missing_ok=True)  # a killed writer's (unlink never follows a symlink)
        with open(tmp, "xb", opener=_nofollow) as fh:
            fh.write(data)
        os.replace(tmp, path)
        return path

    @staticmethod
    def load(path: str | Path) -> RunRecord:
        """Read one record file; ``RecordError`` (naming the file) if it is not one: not a
        regular file (a FIFO is refused, never waited on), too big, nested too deep, not
        JSON (``host/bounded.py``), or not of a record's shape."""
        p = Path(path)
        try:
            data = load_json(p, max_bytes=MAX_RECORD_BYTES, follow=False)
        except BadFileError as e:
            raise RecordError(str(e)) from None
        except OSError as e:
            raise RecordError(f"{p}: cannot be read: {e.strerror or e}") from None
        try:
            return RunRecord.from_json(data)
        except RecordError as e:
            raise RecordError(f"{p}: {e}") from None


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


# --- field checks: (name, value) -> value, or RecordError --------------------------------


def _any(name: str, v: Any) -> Any:
    return v


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise RecordError(f"field {name!r} must be a string, not {type(v).__name__}")
    return v


def _opt_str(name: str, v: Any) -> str | None:
    return None if v is None else _str(name, v)


def _count(name: str, v: Any) -> int:
    if type(v) is not int or v < 0:
        raise RecordError(f"field {name!r} must be a non-negative integer, not {v!r}")
    return v


def _number(name: str, v: Any) -> float:
    if type(v) not in (int, float) or not math.isfinite(v):
        raise RecordError(f"field {name!r} must be a finite number, not {v!r}")
    return float(v)


def _numbers(name: str, v: Any) -> list[float]:
    if not isinstance(v, list):
        raise RecordError(f"field {name!r} must be a list of numbers, not {type(v).__name__}")
    return [_number(f"{name}[{i}]", x) for i, x in enumerate(v)]


def _counts(name: str, v: Any) -> dict[str, int]:
    if not isinstance(v, dict):
        raise RecordError(f"field {name!r} must be an object of counts, not {type(v).__name__}")
    for k, n in v.items():
        if not _COUNT_NAME_RE.fullmatch(k):
            raise RecordError(f"field {name!r} has a kind that is not one word: {k!r}")
        _count(f"{name}[{k!r}]", n)
    return dict(v)


def _obj(name: str, v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise RecordError(f"field {name!r} must be an object, not {type(v).__name__}")
    return dict(v)


def _opt_obj(name: str, v: Any) -> dict[str, Any] | None:
    return None if v is None else _obj(name, v)


def _outcome(name: str, v: Any) -> str:
    v = _OLD_OUTCOMES.get(v, v) if isinstance(v, str) else v
    if v not in OUTCOMES:
        raise RecordError(f"field {name!r} must be one of {', '.join(OUTCOMES)}, not {v!r}")
    return str(v)


def _checks(name: str, v: Any) -> dict[str, Check]:
    out: dict[str, Check] = {}
    for k, c in _obj(name, v).items():
        c = _obj(f"{name}[{k!r}]", c)
        valid = c.get("valid")
        if type(valid) not in (bool, type(None)):
            raise RecordError(f"field {name}[{k!r}].valid must be true, false or null")
        check = Check(valid=valid, detail=str(c.get("detail", "")))
        if "anomalies" in c:  # the named anomalies behind a verdict (records may lack them)
            found = c["anomalies"]
            if not isinstance(found, list) or not all(isinstance(x, dict) for x in found):
                raise RecordError(f"field {name}[{k!r}].anomalies must be a list of objects")
            check["anomalies"] = [dict(x) for x in found]
        if "verified" in c:  # how many things the check compared (newer records)
            n = c["verified"]
            if type(n) is not int or not 0 <= n <= 10**9:
                raise RecordError(f"field {name}[{k!r}].verified must be an integer >= 0")
            check["verified"] = n
        out[k] = check
    return out


def _reasons(name: str, v: Any) -> dict[str, str]:
    d = _obj(name, v)
    for k, why in d.items():
        if not isinstance(why, str):
            raise RecordError(f"field {name}[{k!r}] must be a string (a reason)")
    return d


def _extra(name: str, v: Any) -> dict[str, Any]:
    d = _obj(name, v)
    if "recoveries_by_mode" in d and d["recoveries_by_mode"] is not None:
        _counts(f"{name}.recoveries_by_mode", d["recoveries_by_mode"])
    if d.get("space_missing") is not None:
        _reasons(f"{name}.space_missing", d["space_missing"])
    return d


_FIELD_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "run_id": _str,
    "seed": _str,
    "mode": _str,
    "backend": _str,
    "calls": _count,
    "schedule": _opt_obj,
    "faults": _counts,
    "kills": _count,
    "recoveries": _counts,
    "attempts": _count,
    "resume_latencies_ms": _numbers,
    "resume_backoffs_ms": _numbers,
    "outcome": _outcome,
    "checks": _checks,
    "duration_s": _number,
    "repro": _str,
    "durable_mode": _opt_str,
    "extra": _extra,
    "scenario": _opt_str,
}


@dataclass
class RecordScan:
    """The records of a campaign directory that could be read, and the files skipped."""

    records: list[RunRecord]
    skipped: list[tuple[Path, str]]


def scan_records(campaign_dir: str | Path) -> RecordScan:
    """Every readable ``runs/*.json``, in run-id order; each file that is not a record
    (and each duplicate run id) is skipped with the reason, never fatal."""
    runs = Path(campaign_dir) / "runs"
    scan = RecordScan([], [])
    seen: set[str] = set()
    for p in sorted(runs.glob("*.json")):
        try:
            rec = RunRecord.load(p)
        except RecordError as e:
            scan.skipped.append((p, str(e).removeprefix(f"{p}: ").removeprefix(f"{p} ")))
            continue
        if rec.run_id in seen:
            scan.skipped.append((p, f"a second record of run {rec.run_id}"))
            continue
        seen.add(rec.run_id)
        scan.records.append(rec)
    return scan


def load_records(campaign_dir: str | Path) -> list[RunRecord]:
    """Every ``runs/*.json`` of a campaign directory, in run-id order; ``RecordError`` at
    the first file that is not a record (``scan_records`` skips such files instead)."""
    runs = Path(campaign_dir) / "runs"
    return [RunRecord.load(p) for p in sorted(runs.glob("*.json"))]
