"""The SUMMARY line: a campaign in one line of ``key=value`` fields, and its parser.

Exactly::

    SUMMARY mode=<m> backend=<b> runs=<n> ok=<n> failed=<n> lab_errors=<n> kills=<n>
    planned_kills=<n> faults=<fault:n,...> recoveries=<kind:n,...> resume_p50_ms=<x>
    resume_p95_ms=<x> seed_base=<s> [<key>=<value> ...]

on one line. Choices: ``failed`` counts the runs where a check of the system under test
failed, ``lab_errors`` the runs the lab itself broke (they say nothing about the
adapter), so ``ok + failed + lab_errors == runs``; ``kills`` counts the drivers killed,
``planned_kills`` the kills the runs' schedules asked for (``Schedule.planned_kills``; not
every one can land: ``campaigns/earned.py`` says how many must, and lines written before
it existed lack the field, read as 0); scenarios may append fields of their
own after ``seed_base`` (``extra``, in order); a ``name:count`` list is sorted by name and is
``-`` when empty (zero counts are left out); percentiles are linear-interpolated
(numpy's default) over every run's resume samples and printed as integers (rounded),
``n/a`` without samples.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from durable_spaces.campaigns.earned import planned_kills
from durable_spaces.campaigns.record import RunRecord

_HEAD = ("mode", "backend", "runs", "ok", "failed", "lab_errors", "kills")
_TAIL = ("faults", "recoveries", "resume_p50_ms", "resume_p95_ms", "seed_base")
_VALUE = r"[^\s=]+"
_LINE = re.compile(
    r"^SUMMARY "
    + " ".join(f"{k}=(?P<{k}>{_VALUE})" for k in _HEAD)
    + r"(?: planned_kills=(?P<planned_kills>[0-9]+))?"  # optional: older lines lack it
    + "".join(f" {k}=(?P<{k}>{_VALUE})" for k in _TAIL)
    + rf"(?P<extra>(?: [a-z_][a-z0-9_]*={_VALUE})*)$"
)


def percentile(samples: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None when empty."""
    if not samples:
        return None
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def format_counts(counts: Mapping[str, int]) -> str:
    items = sorted((k, v) for k, v in counts.items() if v)
    for k, _ in items:
        if not k or re.search(r"[\s=,:]", k):
            raise ValueError(f"a SUMMARY count name must be one word without '=,:': {k!r}")
    return ",".join(f"{k}:{v}" for k, v in items) or "-"


def parse_counts(text: str) -> dict[str, int]:
    if text == "-":
        return {}
    out: dict[str, int] = {}
    for part in text.split(","):
        name, _, n = part.rpartition(":")
        out[name] = int(n)
    return out


def _fmt_ms(x: float | None) -> str:
    return "n/a" if x is None else str(round(x))


@dataclass(frozen=True)
class Summary:
    mode: str
    backend: str
    seed_base: str
    runs: int = 0
    ok: int = 0
    failed: int = 0
    lab_errors: int = 0
    kills: int = 0
    planned_kills: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    recoveries: dict[str, int] = field(default_factory=dict)
    resume_p50_ms: int | None = None
    resume_p95_ms: int | None = None
    #: Fields a scenario adds after ``seed_base`` (name -> one word), in order.
    extra: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def of(
        records: Iterable[RunRecord],
        *,
        mode: str,
        backend: str,
        seed_base: str,
        extra: Mapping[str, str] | None = None,
    ) -> Summary:
        rs = list(records)
        faults: Counter[str] = Counter()
        recov: Counter[str] = Counter()
        lat: list[float] = []
        for r in rs:
            faults.update(r.faults)
            recov.update(r.recoveries)
            lat.extend(r.resume_latencies_ms)
        ok = sum(1 for r in rs if r.outcome == "ok")
        lab = sum(1 for r in rs if r.outcome == "lab_error")
        p50, p95 = percentile(lat, 50), percentile(lat, 95)
        return Summary(
            mode=mode,
            backend=backend,
            seed_base=seed_base,
            runs=len(rs),
            ok=ok,
            failed=len(rs) - ok - lab,
            lab_errors=lab,
            kills=sum(r.kills for r in rs),
            planned_kills=sum(planned_kills(r) for r in rs),
            faults=dict(faults),
            recoveries=dict(recov),
            resume_p50_ms=None if p50 is None else round(p50),
            resume_p95_ms=None if p95 is None else round(p95),
            extra=dict(extra or {}),
        )

    def line(self) -> str:
        for k, v in (("mode", self.mode), ("backend", self.backend), ("seed_base", self.seed_base)):
            if not v or re.search(r"[\s=]", v):
                raise ValueError(f"SUMMARY {k} must be one word without '=': {v!r}")
        for k, v in self.extra.items():
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", k) or not v or re.search(r"[\s=]", v):
                raise ValueError(f"a SUMMARY extra field must be word=word: {k!r}={v!r}")
        tail = "".join(f" {k}={v}" for k, v in self.extra.items())
        return (
            f"SUMMARY mode={self.mode} backend={self.backend} runs={self.runs} ok={self.ok} "
            f"failed={self.failed} lab_errors={self.lab_errors} kills={self.kills} "
            f"planned_kills={self.planned_kills} faults={format_counts(self.faults)} "
            f"recoveries={format_counts(self.recoveries)} "
            f"resume_p50_ms={_fmt_ms(self.resume_p50_ms)} "
            f"resume_p95_ms={_fmt_ms(self.resume_p95_ms)} seed_base={self.seed_base}{tail}"
        )

    @staticmethod
    def parse(line: str) -> Summary:
        """Read a SUMMARY line back (``ValueError`` when it is not exactly one)."""
        m = _LINE.match(line.strip())
        if m is None:
            raise ValueError(f"not a SUMMARY line: {line!r}")
        g = m.groupdict()

        def ms(x: str) -> int | None:
            return None if x == "n/a" else int(x)

        return Summary(
            mode=g["mode"],
            backend=g["backend"],
            seed_base=g["seed_base"],
            runs=int(g["runs"]),
            ok=int(g["ok"]),
            failed=int(g["failed"]),
            lab_errors=int(g["lab_errors"]),
            kills=int(g["kills"]),
            planned_kills=int(g["planned_kills"] or 0),
            faults=parse_counts(g["faults"]),
            recoveries=parse_counts(g["recoveries"]),
            resume_p50_ms=ms(g["resume_p50_ms"]),
            resume_p95_ms=ms(g["resume_p95_ms"]),
            extra=dict(kv.split("=", 1) for kv in g["extra"].split()),
        )


def scenario_fields(records: Iterable[RunRecord], names: Sequence[str]) -> dict[str, str]:
    """A scenario's own SUMMARY fields: each counter summed over the runs' ``extra``."""
    rs = list(records)
    return {n: str(sum(int(r.extra.get(n) or 0) for r in rs)) for n in names}


def summary_line(records: Iterable[RunRecord], *, mode: str, backend: str, seed_base: str) -> str:
    return Summary.of(records, mode=mode, backend=backend, seed_base=seed_base).line()


def parse_summary(line: str) -> Summary:
    return Summary.parse(line)


def emit(w: IO[str], line: str) -> None:
    """Write one result line (SUMMARY, REPRO, ...) whole: ``print`` writes its text and
    its newline apart when Python runs unbuffered (CI's ``PYTHONUNBUFFERED=1``), and a
    line teed to a file then met the report's stderr line between the two."""
    w.write(f"{line}\n")
    w.flush()
