"""Hand-built checker inputs: a real SQLite log written by the adapter's SqliteStorage
(the checker reads it back raw) and a real workspace directory.

``scene()`` is one small consistent run of the scripted workload's three kinds of call:
a write, two appends and an edit of the written file, then the final answer. Each test
of an anomaly breaks one thing in it and looks for the anomaly's name and witness.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.campaigns.checker import check_all
from durable_spaces.campaigns.checks.call_checkpoints import Manifests
from durable_spaces.campaigns.checks.checkpoint import LastCheckpoint
from durable_spaces.campaigns.checks.inputs import (
    Inputs,
    LaunchRecord,
    ProcessListing,
    Workload,
)
from durable_spaces.campaigns.checks.rawlog import read_log
from durable_spaces.campaigns.checks.workload import apply
from durable_spaces.campaigns.checks.workspace import walk_host
from durable_spaces.harness.log import MemoryFence, SqliteFence, SqliteStorage
from durable_spaces.harness.models import ScriptedModel

W = "call-s0-aaaaaaaa"  # write f0.txt
B1 = "call-s1-bbbbbbbb"  # append to journal.txt
E = "call-s2-cccccccc"  # edit f0.txt: its second line gains a token line after it
B3 = "call-s3-dddddddd"  # append to journal.txt

F0_WRITTEN = "s0-aaaaaaaa-0\ns0-aaaaaaaa-1\n"
F0 = "s0-aaaaaaaa-0\ns0-aaaaaaaa-1\ns2-cccccccc-e\n"
JOURNAL = "s1-bbbbbbbb\ns3-dddddddd\n"


def append(token: str) -> dict[str, str]:
    return {"command": f"printf '%s\\n' '{token}' >> journal.txt"}


class Transcript:
    """Commits of one conversation, each at an epoch; ``stale=True`` stores a commit at
    an epoch below the floor (a fence that failed: what the checker must notice)."""

    def __init__(self, path: Path, epoch: int = 1) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.storage = SqliteStorage(path)
        self.epoch = epoch
        self.n = 0
        self.seqs: dict[str, int] = {}  # call id -> its result's commit
        self.commit([{"op": "conversation", "id": "c1", "parent_id": None}])
        self.commit([self._entry("user", {"content": "go"})])

    def _entry(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        return {"op": "entry", "id": f"e{self.n}", "conversation_id": "c1", "kind": kind,
                "data": data}  # fmt: skip

    def commit(
        self, ops: list[dict[str, Any]], epoch: int | None = None, stale: bool = False
    ) -> int:
        e = self.epoch if epoch is None else epoch
        self.storage.fence = MemoryFence(e) if stale else SqliteFence(self.storage, e)
        return self.storage.append(ops)

    def call(
        self,
        cid: str,
        name: str,
        args: Mapping[str, Any],
        status: str | None = "ok",
        docs: Mapping[str, Any] | None = None,
        **kw: Any,
    ) -> int:
        """The call, ``docs`` (its outcome: the image the adapter commits before the
        result), then its result."""
        tc = {"id": cid, "name": name, "args": dict(args)}
        seq = self.commit([self._entry("assistant", {"content": "", "tool_calls": [tc]})], **kw)
        for doc_name, value in (docs or {}).items():
            self.doc(doc_name, value)
        if status is not None:
            data = {"call_id": cid, "name": name, "status": status, "content": status}
            seq = self.seqs[cid] = self.commit([self._entry("tool_result", data)], **kw)
        return seq

    def doc(self, name: str, value: Any) -> int:
        return self.commit([{"op": "doc", "conversation_id": "c1", "name": name, "value": value}])

    def done(self) -> int:
        return self.commit(
            [
                self._entry("assistant", {"content": "done", "tool_calls": []}),
                {"op": "submission", "id": "s1", "state": "done"},
            ]
        )

    def close(self) -> None:
        self.storage.close()


def write_tree(root: Path, files: Mapping[str, str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for p, text in files.items():
        (root / p).write_text(text)
        os.chmod(root / p, 0o644)


def image_docs(files: Mapping[str, str], v: int = 1) -> dict[str, Any]:
    """The transactional image of ``files`` as the log's documents, version ``v`` (format
    of durable_spaces/adapter/image_log.py: a pointer, a full table, one blob per
    content)."""
    table, docs = {}, {}
    for p, text in sorted(files.items()):
        data = text.encode()
        sha = hashlib.sha256(data).hexdigest()
        table[p] = {"kind": "file", "mode": 0o644, "size": len(data), "sha256": sha}
        docs[f"cua.blob/{sha}"] = base64.b64encode(data).decode()
    docs[f"cua.space.image/full/{v}"] = table
    docs["cua.space.image"] = {"v": v, "full": v}
    docs["cua.space"] = {"mode": "transactional", "instance": "inst-1", "calls": {}}
    return docs


@dataclass
class Scene:
    log: Path
    root: Path
    t: Transcript
    launches: list[LaunchRecord] = field(default_factory=lambda: [LaunchRecord(1, pid=100)])
    workload: Workload | None = None
    host_clock: bool = True
    #: A checkpoint run's last checkpoint and every call's manifest (``scene(checkpoint=)``).
    checkpoint: LastCheckpoint | None = None
    manifests: Manifests | None = None

    def inputs(self) -> Inputs:
        return Inputs(
            read_log(self.log),
            walk_host(str(self.root)),
            workload=self.workload,
            launches=self.launches,
            processes=ProcessListing("mark"),
            host_clock=self.host_clock,
            kind="local",
            checkpoint=self.checkpoint,
            manifests=self.manifests,
        )

    def verdicts(self) -> dict[str, dict[str, Any]]:
        return check_all(self.inputs())

    def anomalies(self, check: str) -> list[dict[str, Any]]:
        v = self.verdicts()[check]
        return list(v["anomalies"])


#: The consistent run's calls, with the files as each leaves them.
CALLS: list[tuple[str, str, dict[str, str], dict[str, str]]] = [
    (W, "write", {"path": "f0.txt", "content": F0_WRITTEN}, {"f0.txt": F0_WRITTEN}),
    (B1, "bash", append("s1-bbbbbbbb"), {"f0.txt": F0_WRITTEN, "journal.txt": "s1-bbbbbbbb\n"}),
    (E, "edit", {"path": "f0.txt", "old_text": "s0-aaaaaaaa-1\n",
                 "new_text": "s0-aaaaaaaa-1\ns2-cccccccc-e\n"},
     {"f0.txt": F0, "journal.txt": "s1-bbbbbbbb\n"}),
    (B3, "bash", append("s3-dddddddd"), {"f0.txt": F0, "journal.txt": JOURNAL}),
]  # fmt: skip


def checkpoint_manifest(files: Mapping[str, str], root: Path) -> tuple[str, bytes]:
    """A workspace checkpoint of ``files`` (its id and manifest, the adapter's format:
    durable_spaces/adapter/checkpoints/manifest.py), with the times and modes ``root`` has where it
    holds the same file (so the last one can equal the workspace)."""
    m = {".": mf.ManifestEntry("d", os.stat(root).st_mode & 0o7777 if root.exists() else 0o755)}
    for p, text in files.items():
        data = text.encode()
        st = os.stat(root / p) if (root / p).exists() else None
        same = st is not None and (root / p).read_bytes() == data
        m[p] = mf.ManifestEntry("f", 0o644, len(data), hashlib.sha256(data).hexdigest(),
                        st.st_mtime_ns if same and st is not None else 0)  # fmt: skip
    data = mf.encode(m)
    return f"cp-m{hashlib.sha256(data).hexdigest()}", data


def scene(
    tmp: Path,
    *,
    transactional: bool = False,
    checkpoint: bool = False,
    finish: bool = True,
    images: Mapping[str, Mapping[str, str]] | None = None,
) -> Scene:
    """The consistent run: W, B1, E, B3, done; the workspace as it implies. Transactional:
    each call's image (its files as it left them, or ``images[call]``) committed before
    its result, as the adapter's outcome is. Checkpoint: each call's checkpoint (of those
    files) recorded in the ``cua.space`` document with its result, every manifest and
    the last one read as ``checks.checkpoint``/``checks.call_checkpoints`` read them."""
    t = Transcript(tmp / "log.sqlite")
    files = {"f0.txt": F0, "journal.txt": JOURNAL}
    root = tmp / "work"
    write_tree(root, files)
    manifests: dict[str, bytes] = {}
    calls: dict[str, Any] = {}
    last = None
    for v, (cid, name, args, after) in enumerate(CALLS, 1):
        docs = image_docs((images or {}).get(cid, after), v) if transactional else None
        if checkpoint:
            last, data = checkpoint_manifest((images or {}).get(cid, after), root)
            manifests[last] = data
            calls[cid] = {"call_id": cid, "tool": name, "order": v, "mode": "checkpoint",
                          "checkpoint": last}  # fmt: skip
            docs = {"cua.space": {"mode": "checkpoint", "calls": dict(calls),
                                  "last_checkpoint": last}}  # fmt: skip
        t.call(cid, name, args, docs=docs)
    if finish:
        t.done()
    s = Scene(tmp / "log.sqlite", root, t)
    if checkpoint and last is not None:
        s.checkpoint = LastCheckpoint(last, manifests[last])
        s.manifests = Manifests(manifests, {})
    return s


def scripted(tmp: Path, seed: str, calls: int, interrupted: frozenset[int] = frozenset()) -> Scene:
    """A run of the real ScriptedModel (steps in ``interrupted`` end interrupted), with
    the workspace its transcript implies: consistent, including the replay."""
    model = ScriptedModel(seed, calls)
    files: dict[str, str] = {}
    steps = []
    for step in range(calls):
        tc = model.call(step, dict(files))
        status = "interrupted" if step in interrupted else "ok"
        steps.append((tc, status))
        if status == "ok":
            assert apply(files, tc.name, tc.args) is None
    # the workspace first, the log after: as a driver's run leaves them (a tree written
    # after the last commit is what the stale-write check exists to find)
    root = tmp / "work"
    write_tree(root, files)
    t = Transcript(tmp / "log.sqlite")
    for tc, status in steps:
        t.call(tc.id, tc.name, tc.args, status=status)
    t.done()
    return Scene(tmp / "log.sqlite", root, t, workload=Workload(seed, calls))


def names(anomalies: list[dict[str, Any]]) -> list[str]:
    return [a["name"] for a in anomalies]


def dump(v: Any) -> str:
    return json.dumps(v, indent=1, default=str)[:3000]
