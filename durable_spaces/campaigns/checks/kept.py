"""A run's checker inputs kept on disk, so anyone can re-check it by hand, offline.

``<run dir>/kept/`` holds:

- ``workspace.tar``: the workspace as the checker read it (pax tar: bytes, modes,
  symlinks, directories, fifos, devices, times to the nanosecond; ``tar -tvf`` lists it);
- ``log.sqlite`` (and ``log.sqlite-wal`` if there was one) or ``log.jsonl``: the raw log,
  copied with its file times;
- ``checkpoint.manifest``: a checkpoint run's last checkpoint, as the Space's copy held it;
- ``inputs.json``: the rest (workload, launch history, process listing, the server's
  probe, the Space's kind and clock, the nodes tar cannot hold such as sockets, the
  log's write time).

``load`` turns that back into ``Inputs``; ``durable-spaces check <run dir>`` runs every
check on it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

from durable_spaces.campaigns.checks.call_checkpoints import Manifests
from durable_spaces.campaigns.checks.checkpoint import (
    MANIFEST_ID,
    MAX_MANIFEST_BYTES,
    LastCheckpoint,
)
from durable_spaces.campaigns.checks.inputs import (
    Inputs,
    LaunchRecord,
    ProcessListing,
    ServerProbe,
    Workload,
)
from durable_spaces.campaigns.checks.rawlog import log_files, read_log
from durable_spaces.campaigns.checks.workspace import (
    node_from_json,
    node_to_json,
    parse_tar,
    to_tar,
)
from durable_spaces.errors import ConfigError, DurableSpacesError
from durable_spaces.host.bounded import load_json, read_bytes

KEPT = "kept"
#: The kept files' bounds: what a run's checker can have read (``load`` refuses more).
MAX_INPUTS_BYTES = 256 << 20
MAX_TAR_BYTES = 8 << 30
VERSION = 1
#: Every call's checkpoint manifest, by id (``checks.call_checkpoints``).
MANIFESTS = "manifests"


def keep(run_dir: str | Path, inputs: Inputs) -> Path:
    """Write ``inputs`` under ``<run_dir>/kept`` (replacing an earlier copy)."""
    d = Path(run_dir) / KEPT
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    tar, rest = to_tar(inputs.workspace)
    (d / "workspace.tar").write_bytes(tar)
    src = Path(inputs.log.path)
    name = "log.sqlite" if inputs.log.format == "sqlite" else "log.jsonl"
    for f in log_files(src):
        shutil.copy2(f, d / (name + f.name[len(src.name) :]))
    meta: dict[str, Any] = {
        "version": VERSION,
        "log": name,
        "log_written_ns": inputs.log.written_ns,
        "kind": inputs.kind,
        "host_clock": inputs.host_clock,
        "fine_times": inputs.workspace.fine_times,
        "source": inputs.workspace.source,
        "untarred": {p: node_to_json(n) for p, n in rest.items()},
        "workload": inputs.workload.to_json() if inputs.workload else None,
        "launches": None if inputs.launches is None else [la.to_json() for la in inputs.launches],
        "processes": inputs.processes.to_json() if inputs.processes else None,
        "server": inputs.server.to_json() if inputs.server else None,
        "checkpoint": inputs.checkpoint.to_json() if inputs.checkpoint else None,
        "notes": inputs.notes + inputs.workspace.notes,
    }
    if inputs.checkpoint is not None and inputs.checkpoint.data is not None:
        (d / "checkpoint.manifest").write_bytes(inputs.checkpoint.data)
    if inputs.manifests is not None:  # every call's (checkpoint_follows_calls)
        meta["manifests"] = dict(inputs.manifests.unread)
        meta["manifests_store"] = inputs.manifests.store
        (d / MANIFESTS).mkdir()
        for cid, data in inputs.manifests.data.items():
            (d / MANIFESTS / f"{cid}.manifest").write_bytes(data)
    (d / "inputs.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return d


def load(path: str | Path) -> Inputs:
    """The inputs kept under ``path`` (a run directory or its ``kept/``)."""
    d = Path(path)
    if (d / KEPT / "inputs.json").exists():
        d = d / KEPT
    meta_path = d / "inputs.json"
    if not meta_path.exists():
        raise ConfigError(
            f"{path} holds no kept run (no {KEPT}/inputs.json): run the campaign with --keep"
        )
    try:
        meta = load_json(meta_path, max_bytes=MAX_INPUTS_BYTES, follow=False)
        if meta.get("version") != VERSION:
            raise ConfigError(f"{meta_path}: version {meta.get('version')!r}, want {VERSION}")
        if meta["log"] not in ("log.sqlite", "log.jsonl"):  # a name, never a path
            raise ConfigError(f"{meta_path}: log {str(meta['log'])[:80]!r} is not a kept log")
        log = read_log(d / meta["log"])
        log = dataclasses.replace(log, written_ns=meta.get("log_written_ns"))
        tar = read_bytes(d / "workspace.tar", max_bytes=MAX_TAR_BYTES, follow=False)
        ws = parse_tar(tar, f"kept:{d / 'workspace.tar'}")
        ws.fine_times = ws.fine_times and bool(meta.get("fine_times", True))
        for p, n in (meta.get("untarred") or {}).items():
            ws.nodes[str(p)] = node_from_json(n)
        launches = meta.get("launches")
        cp = meta.get("checkpoint")
        last = None
        if cp:
            data_path = d / "checkpoint.manifest"
            data = (
                read_bytes(data_path, max_bytes=MAX_MANIFEST_BYTES, follow=False)
                if data_path.exists() or data_path.is_symlink()
                else None
            )
            last = LastCheckpoint(str(cp["id"]), data, str(cp.get("unread") or ""))
        return Inputs(
            log,
            ws,
            workload=Workload.from_json(meta["workload"]) if meta.get("workload") else None,
            launches=None if launches is None else [LaunchRecord(**la) for la in launches],
            processes=ProcessListing.from_json(meta["processes"])
            if meta.get("processes")
            else None,
            host_clock=bool(meta.get("host_clock")),
            kind=str(meta.get("kind") or ""),
            notes=[str(n) for n in meta.get("notes") or []],
            server=ServerProbe.from_json(meta["server"]) if meta.get("server") else None,
            checkpoint=last,
            manifests=_manifests(d, meta.get("manifests"), meta.get("manifests_store", True)),
        )
    except DurableSpacesError:
        raise
    except (OSError, ValueError, KeyError, TypeError, tarfile.TarError) as e:
        raise ConfigError(f"{d}: the kept run is unreadable: {type(e).__name__}: {e}") from e


def _manifests(d: Path, unread: Any, store: Any) -> Manifests | None:
    """The manifests kept beside the inputs (None: kept by a build that read none)."""
    if unread is None:
        return None
    data = {}
    for f in sorted((d / MANIFESTS).glob("*.manifest")) if (d / MANIFESTS).is_dir() else []:
        cid = f.name.removesuffix(".manifest")
        if MANIFEST_ID.fullmatch(cid) and not f.is_symlink():
            data[cid] = read_bytes(f, max_bytes=MAX_MANIFEST_BYTES, follow=False)
    return Manifests(data, {str(k): str(v) for k, v in dict(unread).items()}, bool(store))
