"""Does every committed call's effect show in the workspace exactly once?

Each path of the workspace (and each the log implies) is diagnosed against what the
checker's interpreter (``workload``) implies, naming what it finds:

- ``lost_effect``: a committed ok call's effect is missing (a file gone, a line gone, or
  the file is as it was before later calls);
- ``duplicate_effect``: an effect applied twice (an append line or an edit's token line
  twice; a write's content back after a later call changed the file);
- ``uncommitted_effect``: a line of a call whose result is not ``ok`` (interrupted,
  error, or none committed): an effect the recovery should have undone;
- ``reordered_effect``: the right lines in the wrong order;
- ``phantom_file``: a file, directory (empty ones too), symlink or special file that no
  committed call explains, the adapter's ``.ds-*`` temporaries included;
- ``torn_file``: the content is a strict prefix, or a zero-filled copy, of a version the
  log implies;
- ``wrong_content``: a difference none of the above explains.

``workspace_equals_log`` reports them all; ``exactly_once`` only the four about effects.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from typing import TYPE_CHECKING

from durable_spaces.campaigns.checks.verdict import Anomaly, Verdict, anomaly, judge, unknown
from durable_spaces.campaigns.checks.workload import Implied
from durable_spaces.campaigns.checks.workspace import ROOT, Node

if TYPE_CHECKING:
    from durable_spaces.campaigns.checks.inputs import Inputs

EFFECT_ANOMALIES = frozenset(
    {"lost_effect", "duplicate_effect", "uncommitted_effect", "reordered_effect"}
)


def _torn(got: bytes, ref: bytes) -> bool:
    """``got`` is a strict prefix of ``ref``, or ``ref`` with bytes zeroed (a crash that
    kept a file's size but not its data, or extended it with zeros)."""
    if got == ref:
        return False
    if len(got) < len(ref) and ref.startswith(got):
        return True
    if b"\0" not in got:
        return False
    stripped = got.rstrip(b"\0")
    if stripped != got and ref.startswith(stripped):
        return True
    return len(got) == len(ref) and all(g in (r, 0) for g, r in zip(got, ref, strict=True))


def diagnose(implied: Implied, nodes: dict[str, Node], status: dict[str, str]) -> list[Anomaly]:
    """Every anomaly of the workspace ``nodes`` against ``implied``; ``status`` maps call
    ids to their committed result status."""
    out: list[Anomaly] = []
    for path, node in sorted(nodes.items()):
        if path == ROOT:
            continue
        if path not in implied.files:
            out.append(_phantom(path, node, implied, status))
        elif node.kind != "file":
            detail = f"is a {node.kind}; the log implies a file"
            out.append(anomaly("lost_effect", detail, path=path, witness=implied.calls_on(path)))
        else:
            out += _content(path, node.data or b"", implied, status)
    for path in sorted(set(implied.files) - set(nodes)):
        detail = "is missing; the log implies it"
        out.append(anomaly("lost_effect", detail, path=path, witness=implied.calls_on(path)))
    return out


def _phantom(path: str, node: Node, implied: Implied, status: dict[str, str]) -> Anomaly:
    name = posixpath.basename(path)
    what = {"dir": "a directory", "symlink": f"a symlink to {node.target!r}"}.get(
        node.kind, f"a {node.kind}"
    )
    witness: list[int | str] = []
    if node.kind == "file":
        lines = (node.data or b"").decode(errors="replace").splitlines()
        witness = [implied.origin[ln] for ln in lines if ln in implied.origin]
        what = f"a file of {node.size} bytes"
    detail = f"{what} that no committed call explains"
    if name.startswith(".ds-"):
        detail += " (a temporary of the adapter left behind)"
    if witness:
        states = sorted({f"{c}: {status.get(str(c), 'no result')}" for c in witness})
        detail += f"; its lines come from {', '.join(states)}"
    return anomaly("phantom_file", detail, path=path, witness=witness)


def _content(path: str, got: bytes, implied: Implied, status: dict[str, str]) -> list[Anomaly]:
    want = implied.files[path]
    if got == want.encode():
        return []
    versions = implied.versions.get(path, [])
    for k in range(len(versions) - 2, -1, -1):  # an earlier version, newest first
        v = versions[k]
        if got != v.content.encode():
            continue
        later = [x.call for x in versions[k + 1 :]]
        if v.tool == "write":
            detail = (
                f"holds what write {v.call} wrote although {', '.join(later)} changed it "
                f"later: {v.call} was applied again (or their effects were lost)"
            )
            return [anomaly("duplicate_effect", detail, path=path, witness=[v.call, *later])]
        detail = f"is as it was after {v.call}: the effects of {', '.join(later)} are missing"
        return [anomaly("lost_effect", detail, path=path, witness=later)]
    for v in reversed(versions):
        ref = v.content.encode()
        if _torn(got, ref):
            detail = (
                f"{len(got)} bytes: a torn (prefix or zero-filled) copy of the "
                f"{len(ref)} bytes the file held after {v.call}"
            )
            return [anomaly("torn_file", detail, path=path, witness=[v.call])]
    return _lines(path, got.decode(errors="replace"), want, implied, status)


def _remover(line: str, path: str, implied: Implied) -> str | None:
    """The committed call after which ``line`` (once in ``path``) was gone."""
    seen = False
    for v in implied.versions.get(path, []):
        present = line in v.content.splitlines()
        if present:
            seen = True
        elif seen:
            return v.call
    return None


def _lines(
    path: str, text: str, want: str, implied: Implied, status: dict[str, str]
) -> list[Anomaly]:
    got_lines, want_lines = text.splitlines(), want.splitlines()
    cg, cw = Counter(got_lines), Counter(want_lines)
    origin = implied.origin
    out: list[Anomaly] = []

    def by_call(lines: list[str]) -> dict[str | None, list[str]]:
        groups: dict[str | None, list[str]] = {}
        for ln in lines:
            groups.setdefault(origin.get(ln), []).append(ln)
        return groups

    for call, lines in by_call([ln for ln in cw if cg[ln] < cw[ln]]).items():
        detail = f"lines of {call} missing: {lines[:3]}"
        out.append(anomaly("lost_effect", detail, path=path, witness=[call] if call else []))
    for call, lines in by_call([ln for ln in cg if cg[ln] > cw[ln] and cw[ln]]).items():
        counts = ", ".join(f"{ln!r} x{cg[ln]} (log: x{cw[ln]})" for ln in lines[:3])
        detail = f"applied twice: {counts}"
        out.append(anomaly("duplicate_effect", detail, path=path, witness=[call] if call else []))
    for call, lines in by_call([ln for ln in cg if not cw[ln]]).items():
        if call is None:
            detail = f"lines no call wrote: {lines[:3]}"
            out.append(anomaly("wrong_content", detail, path=path))
        elif call in implied.committed:
            gone = _remover(lines[0], path, implied)
            detail = f"lines of {call} still there although {gone} replaced them: {lines[:3]}"
            out.append(anomaly("lost_effect", detail, path=path, witness=[gone or call]))
        else:
            detail = f"lines of {call} ({status.get(call, 'no result committed')}): {lines[:3]}"
            out.append(anomaly("uncommitted_effect", detail, path=path, witness=[call]))
    if out:
        return out
    if cg == cw and got_lines != want_lines:
        i = next(i for i, (a, b) in enumerate(zip(got_lines, want_lines, strict=False)) if a != b)
        witness = [c for c in (origin.get(want_lines[i]), origin.get(got_lines[i])) if c]
        detail = f"line {i + 1} is {got_lines[i]!r}; the log implies {want_lines[i]!r} there"
        return [anomaly("reordered_effect", detail, path=path, witness=witness)]
    detail = f"differs from the log ({len(text)} vs {len(want)} characters), same lines"
    return [anomaly("wrong_content", detail, path=path, witness=implied.calls_on(path))]


# --- the checks ------------------------------------------------------------------------------


def workspace_equals_log(inputs: Inputs) -> Verdict:
    """The workspace holds exactly the files the committed transcript implies."""
    implied = inputs.implied
    if implied.problems:
        return unknown("; ".join(implied.problems[:5]))
    found = diagnose(implied, inputs.workspace.nodes, inputs.status)
    notes = "".join(f"; {n}" for n in inputs.workspace.notes + inputs.notes)
    return judge(
        found, f"{len(implied.files)} files as the log implies{notes}", verified=len(implied.files)
    )


def exactly_once(inputs: Inputs) -> Verdict:
    """Every committed effect (append, edit, write) took effect once, in order."""
    implied = inputs.implied
    if implied.problems:
        return unknown("; ".join(implied.problems[:5]))
    found = diagnose(implied, inputs.workspace.nodes, inputs.status)
    kinds = Counter(str(inputs.history.calls[c].get("name")) for c in implied.committed)
    ok = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no calls"
    return judge(
        [a for a in found if a["name"] in EFFECT_ANOMALIES],
        f"{ok}: each once",
        verified=len(implied.committed),
    )
