"""``checkpoint_equals_workspace``: a checkpoint run's last checkpoint, read raw from the
Space's copy and decoded by the checker, must be the workspace the run left. Each test
breaks one thing of a consistent scene and looks for the anomaly (or, where the claim
does not apply, for the reason it was not checked)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from durable_spaces.adapter.checkpoints import carry
from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.adapter.checkpoints.manifest_build import build
from durable_spaces.adapter.checkpoints.workspace_tree import walk_host as adapter_walk
from durable_spaces.campaigns.checker import check_all
from durable_spaces.campaigns.checks import kept
from durable_spaces.campaigns.checks.checkpoint import read_last
from durable_spaces.campaigns.checks.inputs import Inputs, Workload
from durable_spaces.space import Space
from tests.campaigns.checker_scenes import B3, Scene, scene


def _checkpoint(s: Scene, last_has_it: bool = True) -> str:
    """Take the workspace's manifest as the adapter would, keep it in the Space's copy,
    and record it in the log as checkpoint mode does after the last call."""
    shas: dict[str, str] = {}

    def take(path: str, node: object, fd: int) -> None:
        shas[path] = hashlib.sha256(os.read(fd, 1 << 20)).hexdigest()

    listing = adapter_walk(str(s.root), lambda p, n: True, take)
    data = mf.encode(build(listing, shas.__getitem__))
    cid = CheckpointId.for_manifest(B3, data)
    copy = s.root.parent / ".ds-checkpoints"
    copy.mkdir(exist_ok=True)
    (copy / f"{cid}.manifest").write_bytes(data)
    rec = {"call_id": B3, "tool": "bash", "order": 4, "checkpoint": cid if last_has_it else None}
    calls = {B3: rec}
    s.t.doc("cua.space", {"mode": "checkpoint", "last_checkpoint": cid, "calls": calls})
    return str(cid)


def _verdict(s: Scene, workload: Workload | None = None) -> dict[str, Any]:
    inputs: Inputs = s.inputs()
    inputs.workload = workload
    space = cast(Space, SimpleNamespace(root=str(s.root)))
    inputs.checkpoint = asyncio.run(read_last(space, "local", inputs.history))
    return check_all(inputs)["checkpoint_equals_workspace"]


def _details(v: dict[str, Any]) -> set[tuple[str, str]]:
    return {(str(a.get("path")), a["detail"]) for a in v["anomalies"]}


def test_the_last_checkpoint_of_a_consistent_run_is_the_workspace(tmp_path: Path) -> None:
    s = scene(tmp_path)
    _checkpoint(s)
    v = _verdict(s)
    assert v["valid"] is True and "paths as checkpoint" in v["detail"], v


def test_content_mode_extra_and_missing_paths_are_named(tmp_path: Path) -> None:
    s = scene(tmp_path)
    _checkpoint(s)
    (s.root / "f0.txt").write_text("changed after the checkpoint\n")
    os.chmod(s.root / "journal.txt", 0o600)
    (s.root / "extra").mkdir()
    (s.root / "link").symlink_to("f0.txt")
    v = _verdict(s)
    assert v["valid"] is False
    found = _details(v)
    assert all(a["name"] == "checkpoint_mismatch" for a in v["anomalies"])
    paths = {p for p, _ in found}
    assert paths == {"f0.txt", "journal.txt", "extra", "link"}, found
    assert any(p == "f0.txt" and "sha256" in d for p, d in found)
    assert any(p == "journal.txt" and "mode 600" in d for p, d in found)
    os.unlink(s.root / "link")
    os.rmdir(s.root / "extra")
    os.unlink(s.root / "journal.txt")
    assert ("journal.txt", "in the checkpoint, not in the workspace") in _details(_verdict(s))


def test_a_damaged_or_missing_copy_is_an_anomaly_not_a_pass(tmp_path: Path) -> None:
    s = scene(tmp_path)
    cid = _checkpoint(s)
    copy = s.root.parent / ".ds-checkpoints" / f"{cid}.manifest"
    data = copy.read_bytes()
    copy.write_bytes(data.replace(b"journal.txt", b"journal.txx"))
    v = _verdict(s)
    assert v["valid"] is False and "not the manifest the id names" in str(v["anomalies"])
    copy.unlink()
    v = _verdict(s)
    assert v["valid"] is False and "No such file" in str(v["anomalies"])


def test_where_the_claim_does_not_apply_the_reason_is_said(tmp_path: Path) -> None:
    s = scene(tmp_path)
    v = _verdict(s)  # no cua.space document in checkpoint mode
    assert v["valid"] is True and "not a checkpoint run" in v["detail"]
    _checkpoint(s, last_has_it=False)  # the last call was interrupted: the one before
    (s.root / "f0.txt").write_text("anything\n")
    assert "not a checkpoint run ending" in _verdict(s)["detail"]
    s2 = scene(tmp_path / "server")
    _checkpoint(s2)
    (s2.root / "f0.txt").write_text("a server's write after the last call\n")
    v = _verdict(s2, Workload(seed="x", calls=4, server=True))
    assert v["valid"] is True and "server run" in v["detail"]
    s3 = scene(tmp_path / "machine")
    rec = {"call_id": B3, "tool": "bash", "order": 4, "checkpoint": "0123456789abcdef01234567"}
    s3.t.doc(
        "cua.space",
        {"mode": "checkpoint", "last_checkpoint": rec["checkpoint"], "calls": {B3: rec}},
    )
    v = _verdict(s3)
    assert v["valid"] is True and "machine checkpoint" in v["detail"]


def test_a_kept_checkpoint_run_rechecks_offline_and_a_tampered_manifest_fails(
    tmp_path: Path,
) -> None:
    s = scene(tmp_path)
    _checkpoint(s)
    s.t.close()
    inputs = s.inputs()
    space = cast(Space, SimpleNamespace(root=str(s.root)))
    inputs.checkpoint = asyncio.run(read_last(space, "local", inputs.history))
    live = check_all(inputs)
    assert live["checkpoint_equals_workspace"]["valid"] is True
    kept.keep(tmp_path / "run", inputs)
    assert check_all(kept.load(tmp_path / "run")) == live
    saved = tmp_path / "run" / "kept" / "checkpoint.manifest"
    saved.write_bytes(saved.read_bytes().replace(b"f0.txt", b"f1.txt"))
    v = check_all(kept.load(tmp_path / "run"))["checkpoint_equals_workspace"]
    assert v["valid"] is False and "not the manifest the id names" in str(v["anomalies"])


def test_a_space_placed_again_from_the_store_is_checked_against_the_store(
    tmp_path: Path,
) -> None:
    """The Space's copy lost the manifest (a Space rebuilt from the store holds none of
    the earlier ones): the store's is read; in neither place, it is an anomaly."""
    s = scene(tmp_path)
    cid = _checkpoint(s)
    copy = s.root.parent / ".ds-checkpoints" / f"{cid}.manifest"
    store = tmp_path / "store"
    store.mkdir()
    (store / copy.name).write_bytes(copy.read_bytes())
    copy.unlink()
    inputs = s.inputs()
    space = cast(Space, SimpleNamespace(root=str(s.root)))
    inputs.checkpoint = asyncio.run(read_last(space, "local", inputs.history, store))
    assert check_all(inputs)["checkpoint_equals_workspace"]["valid"] is True
    (store / copy.name).unlink()
    inputs.checkpoint = asyncio.run(read_last(space, "local", inputs.history, store))
    v = check_all(inputs)["checkpoint_equals_workspace"]
    assert v["valid"] is False and "No such file" in str(v["anomalies"])


def test_a_store_file_that_carries_blobs_is_read_as_its_manifest(tmp_path: Path) -> None:
    """The store's manifest file carries the small blobs it added after the manifest
    (``adapter/checkpoints/carry.py``): the checker reads the manifest before them, and
    still refuses one whose manifest part is not the one the id names."""
    s = scene(tmp_path)
    cid = _checkpoint(s)
    copy = s.root.parent / ".ds-checkpoints" / f"{cid}.manifest"
    data = copy.read_bytes()
    store = tmp_path / "store"
    store.mkdir()
    blob = b"carried\n"
    (store / copy.name).write_bytes(
        data + carry.trailer(len(data), [(hashlib.sha256(blob).hexdigest(), blob)])
    )
    copy.unlink()
    space = cast(Space, SimpleNamespace(root=str(s.root)))

    def verdict() -> dict[str, Any]:
        inputs = s.inputs()
        inputs.checkpoint = asyncio.run(read_last(space, "local", inputs.history, store))
        return check_all(inputs)["checkpoint_equals_workspace"]

    assert verdict()["valid"] is True
    other = data.replace(b"f0.txt", b"f1.txt")
    (store / copy.name).write_bytes(other + carry.trailer(len(other), []))
    v = verdict()
    assert v["valid"] is False and "not the manifest the id names" in str(v["anomalies"])


def test_a_time_the_checkpoint_missed_is_named(tmp_path: Path) -> None:
    """A restore sets the times the manifest holds: a checkpoint that missed a ``touch``
    would restore a wrong one."""
    s = scene(tmp_path)
    _checkpoint(s)
    t = os.stat(s.root / "journal.txt").st_mtime_ns
    os.utime(s.root / "journal.txt", ns=(t, t + 900))  # within a restore's rounding
    assert _verdict(s)["valid"] is True
    os.utime(s.root / "journal.txt", ns=(1_000_000_000, 1_000_000_000))
    found = _details(_verdict(s))
    assert found == {("journal.txt", next(d for p, d in found if p == "journal.txt"))}
    assert "mtime 1000000000;" in next(iter(found))[1]


def test_every_call_s_manifest_is_read_from_the_store_or_the_copy_and_kept(
    tmp_path: Path,
) -> None:
    """``checkpoint_follows_calls`` reads each recorded checkpoint's manifest from the
    store (a carrier's blobs cut off), else the Space's copy; a kept run re-checks the
    same offline, and a manifest tampered with there is named."""
    from durable_spaces.campaigns.checks.call_checkpoints import read_all

    s = scene(tmp_path, checkpoint=True)
    s.t.close()
    assert s.manifests is not None
    want = dict(s.manifests.data)
    store = tmp_path / "store"
    store.mkdir()
    copies = s.root.parent / ".ds-checkpoints"
    copies.mkdir()
    for k, (cid, data) in enumerate(sorted(want.items())):
        if k % 2:  # in the store, carrying a blob after it (checkpoint_carry's footer)
            blob = [(hashlib.sha256(b"x").hexdigest(), b"x")]
            (store / f"{cid}.manifest").write_bytes(data + carry.trailer(len(data), blob))
        else:
            (copies / f"{cid}.manifest").write_bytes(data)
    inputs = s.inputs()
    space = cast(Space, SimpleNamespace(root=str(s.root)))
    inputs.manifests = asyncio.run(read_all(space, "local", inputs.history, store))
    assert dict(inputs.manifests.data) == want and not inputs.manifests.unread
    live = check_all(inputs)
    assert live["checkpoint_follows_calls"]["valid"] is True, live["checkpoint_follows_calls"]
    kept.keep(tmp_path / "run", inputs)
    assert check_all(kept.load(tmp_path / "run")) == live
    first = sorted(want)[0]
    saved = tmp_path / "run" / "kept" / "manifests" / f"{first}.manifest"
    saved.write_bytes(saved.read_bytes().replace(b"f0.txt", b"f9.txt"))
    v = check_all(kept.load(tmp_path / "run"))["checkpoint_follows_calls"]
    assert v["valid"] is False and "not the manifest its id names" in str(v["anomalies"])
    (copies / f"{sorted(want)[0]}.manifest").unlink()
    gone = asyncio.run(read_all(space, "local", inputs.history, store))
    assert set(gone.unread) == {sorted(want)[0]}
    inputs.manifests = asyncio.run(read_all(space, "local", inputs.history, None))
    v = check_all(inputs)["checkpoint_follows_calls"]  # no store: the copy's lack is unknown
    assert v["valid"] is True and "the Space's copy lacks (no store given)" in v["detail"], v
