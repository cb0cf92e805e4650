"""Verdicts and anomalies, in the shape of Jepsen's checkers and Elle's anomaly names.

A verdict is ``{"valid": True|False|None, "detail": str, "anomalies": [...]}``. An
anomaly names what went wrong and carries its witness, so a reader can find the exact
commits or calls that show it: ``{"name", "path", "witness", "detail"}``. ``witness``
holds commit seqs (ints) or call ids (strings); ``path`` is a workspace path or None.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

#: At most this many anomalies are kept per verdict (the detail says how many more).
MAX_ANOMALIES = 50


class Anomaly(TypedDict):
    name: str
    path: str | None
    witness: list[int | str]
    detail: str


Verdict = dict[str, Any]


def anomaly(
    name: str, detail: str, *, path: str | None = None, witness: Iterable[int | str] = ()
) -> Anomaly:
    return Anomaly(name=name, path=path, witness=list(dict.fromkeys(witness)), detail=detail)


def judge(anomalies: Sequence[Anomaly], ok_detail: str, *, verified: int | None = None) -> Verdict:
    """False with the anomalies when there are any, else True with ``ok_detail``.
    ``verified``: how many things (calls, paths) the check compared, for reports."""
    if not anomalies:
        return passed(ok_detail, verified=verified)
    names = sorted({a["name"] for a in anomalies})
    first = anomalies[0]
    where = f" {first['path']}:" if first["path"] else ""
    detail = f"{len(anomalies)} anomalies ({', '.join(names)}); first:{where} {first['detail']}"
    kept = list(anomalies[:MAX_ANOMALIES])
    if len(anomalies) > MAX_ANOMALIES:
        detail += f" ({len(anomalies) - MAX_ANOMALIES} more not listed)"
    out: Verdict = {"valid": False, "detail": detail, "anomalies": kept}
    if verified is not None:
        out["verified"] = verified
    return out


def unknown(detail: str) -> Verdict:
    """The check could not tell (an input it needs is missing or unreadable)."""
    return {"valid": None, "detail": detail, "anomalies": []}


def passed(detail: str, *, verified: int | None = None) -> Verdict:
    out: Verdict = {"valid": True, "detail": detail, "anomalies": []}
    if verified is not None:
        out["verified"] = verified
    return out
