"""Transactional runs: the log's image equals the workspace (``log_image_mismatch``).

The image format (``durable_spaces/adapter/image.py``), decoded here on its own: the
document ``cua.space.image`` is a pointer ``{"v": n, "full": m}`` (or, in old logs, a
plain path table); ``cua.space.image/full/<m>`` is the path table of version m and
``cua.space.image/delta/<k>`` (k = m+1..n) are ``{"put": table, "delete": [paths]}``. A
table maps a path to ``{"kind": "file", "mode", "size", "sha256"}`` or ``{"kind":
"symlink", "target"}``; each blob is the document ``cua.blob/<sha256>`` (base64).

Compared: the set of paths (files and symlinks: the image has no directories or special
files, which ``effects`` reports as phantoms), each file's sha256, size and mode bits,
each symlink's target, and that every blob the image names is in the log and hashes to
its name (a lost Space is rebuilt from those).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from durable_spaces.campaigns.checks.verdict import Anomaly, Verdict, anomaly, judge, passed

if TYPE_CHECKING:
    from durable_spaces.campaigns.checks.inputs import Inputs

POINTER = "cua.space.image"


def decode_image(docs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The path table the log's image pointer names; ``KeyError`` names a missing part."""
    pointer = docs.get(POINTER)
    if not pointer:
        return {}
    if "v" not in pointer:
        return dict(pointer)
    v, full = int(pointer["v"]), int(pointer["full"])
    base = docs.get(f"{POINTER}/full/{full}")
    if base is None:
        raise KeyError(f"the image's full table {full} is not in the log")
    table = dict(base)
    for k in range(full + 1, v + 1):
        d = docs.get(f"{POINTER}/delta/{k}")
        if d is None:
            raise KeyError(f"the image's delta {k} is not in the log")
        for p in d.get("delete", []):
            table.pop(p, None)
        table.update(d.get("put", {}))
    return table


def _blob_ok(docs: Mapping[str, Any], sha: str) -> bool:
    text = docs.get(f"cua.blob/{sha}")
    if not isinstance(text, str):
        return False
    try:
        return hashlib.sha256(base64.b64decode(text, validate=True)).hexdigest() == sha
    except (binascii.Error, ValueError):
        return False


def image_equals_workspace(inputs: Inputs) -> Verdict:
    docs = inputs.history.docs
    mode = (docs.get("cua.space") or {}).get("mode")
    if mode != "transactional":
        return passed(f"not transactional (mode {mode})")
    seq = inputs.history.doc_seq.get(POINTER, 0)
    try:
        table = decode_image(docs)
    except (KeyError, TypeError, ValueError) as err:
        return judge([anomaly("log_image_mismatch", str(err), witness=[seq])], "")
    nodes = {p: n for p, n in inputs.workspace.nodes.items() if n.kind in ("file", "symlink")}
    out: list[Anomaly] = []

    def bad(path: str, detail: str) -> None:
        out.append(anomaly("log_image_mismatch", detail, path=path, witness=[seq]))

    for path in sorted(set(table) | set(nodes)):
        row, n = table.get(path), nodes.get(path)
        if n is None:
            bad(path, "in the image, not in the workspace")
        elif row is None:
            bad(path, f"a {n.kind} in the workspace, not in the image")
        elif row.get("kind") != n.kind:
            bad(path, f"a {n.kind} in the workspace, a {row.get('kind')} in the image")
        elif n.kind == "symlink":
            if row.get("target") != n.target:
                bad(path, f"symlink to {n.target!r}; the image says {row.get('target')!r}")
        else:
            sha, said = hashlib.sha256(n.data or b"").hexdigest(), str(row.get("sha256"))
            if said != sha:
                bad(path, f"content sha256 {sha[:12]}; the image says {said[:12]}")
            elif row.get("size") != n.size:
                bad(path, f"{n.size} bytes; the image says {row.get('size')}")
            if row.get("mode") != n.mode:
                bad(path, f"mode {n.mode:o}; the image says {int(row.get('mode') or 0):o}")
    for path, entry in sorted(table.items()):
        sha = str(entry.get("sha256"))
        if entry.get("kind") == "file" and not _blob_ok(docs, sha):
            bad(path, f"blob {sha[:12]} is missing from the log or damaged")
    return judge(
        out, f"{len(table)} paths, contents, modes and targets as the image", verified=len(table)
    )


def image_follows_calls(inputs: Inputs) -> Verdict:
    """Transactional runs: at each committed ``ok`` call's result, the image (as the log
    held it then) has the file the call changed as the call left it (the interpreter's
    content right after it, ``checks.workload``), anomaly ``call_not_in_image``.

    ``image_equals_workspace`` looks at the end only. A call whose end scan missed its own
    change (a journal that answered from what it knew: the mutant
    ``journal_loss_trusted``) is credited with nothing, and the next call's start finds
    the change and folds it in: the end agrees, but a Space lost in between would have
    been rebuilt without the change while the log said the call had made it."""
    history = inputs.history
    mode = (history.docs.get("cua.space") or {}).get("mode")
    if mode != "transactional":
        return passed(f"not transactional (mode {mode})")
    implied = inputs.implied
    left: dict[str, tuple[str, str]] = {}  # call -> (path, content right after it)
    for path, versions in implied.versions.items():
        for v in versions:
            left[v.call] = (path, v.content)
    docs: dict[str, Any] = {}
    out: list[Anomaly] = []
    checked = 0
    for c in history.commits:
        results: list[str] = []
        for op in c.ops:
            if op.get("conversation_id") != history.conversation:
                continue
            if op.get("op") == "doc" and isinstance(op.get("name"), str):
                docs[op["name"]] = op.get("value")
            elif op.get("op") == "entry" and op.get("kind") == "tool_result":
                raw = op.get("data")
                data: dict[str, Any] = raw if isinstance(raw, dict) else {}
                if data.get("status") == "ok" and str(data.get("call_id")) in left:
                    results.append(str(data.get("call_id")))
        for call in results:
            if history.result_seq.get(call) != c.seq:
                continue  # not the call's first result (the one the interpreter applied)
            path, content = left[call]
            try:
                row = decode_image(docs).get(path)
            except (KeyError, TypeError, ValueError) as err:
                out.append(anomaly("log_image_mismatch", str(err), witness=[call, c.seq]))
                continue
            checked += 1
            want = hashlib.sha256(content.encode()).hexdigest()
            if row is None or row.get("kind") != "file" or row.get("sha256") != want:
                held = "no file" if row is None else f"sha256 {str(row.get('sha256'))[:12]}"
                out.append(anomaly(
                    "call_not_in_image",
                    f"at {call}'s result the image holds {held}; the call left {want[:12]}",
                    path=path, witness=[call, c.seq],
                ))  # fmt: skip
    return judge(
        out, f"{checked} committed calls each in the image at its result", verified=checked
    )
