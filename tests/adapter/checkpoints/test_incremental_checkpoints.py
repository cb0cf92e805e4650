"""Incremental workspace checkpoints: a manifest plus only the blobs of what changed.

What is checked, with real local and cua-spacesd Spaces and a real store directory:

- cost follows the change: a second checkpoint after three files changed adds three
  blobs, and both checkpoints restore exactly;
- restores are verified: a tampered blob (or manifest) is refused with a message naming
  it, the intact copy is used and the bad one mended; none intact changes nothing;
  a manifest whose digest matches (an attacker who wrote the log too) but names a path
  out of the workspace is refused;
- killed anywhere in a take or a prune, every recorded checkpoint stays restorable: a
  failure is injected at every write, rename, unlink and fsync of the store in turn (a
  kill there leaves the same files behind), plus a real SIGKILL at the prune's
  failpoint.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from needs import need

from durable_spaces.adapter.checkpoints import batch as checkpoint_batch
from durable_spaces.adapter.checkpoints import carry, inode_pool
from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints import store as checkpoint_store
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    WorkspaceSnapshots,
)
from durable_spaces.backends import open_backend
from durable_spaces.errors import CheckpointCorruptError, SpaceError
from durable_spaces.space import HostWorkspace, Space, space_name
from tests.adapter.settled import SettledSnapshots

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("spacesd", marks=pytest.mark.spacesd, id="spacesd"),
]
FILES = {f"d{i % 4}/f{i:03d}.txt": f"file {i}\n".encode() * (i + 1) for i in range(40)}


def _need(backend: str) -> None:
    need(backend)


@dataclass
class Lab:
    space: Space
    snaps: WorkspaceSnapshots
    store: DirectoryCheckpointStore
    tmp: Path

    @property
    def root(self) -> Path:
        return Path(self.space.root)

    @property
    def copy(self) -> Path:
        return self.root.parent / ".ds-checkpoints"

    def workspace(self) -> dict[str, bytes]:
        return {
            str(p.relative_to(self.root)): p.read_bytes()
            for p in sorted(self.root.rglob("*"))
            if p.is_file() and not p.is_symlink()
        }

    def store_blobs(self) -> set[str]:
        return {p.name for p in (self.tmp / "store" / "blobs").iterdir()}

    async def write(self, files: dict[str, bytes]) -> None:
        for path, data in files.items():
            await self.space.write_file(path, data, epoch=1)


#: How a checkpoint reaches the workspace: read here (its directory is on this host) or
#: through commands in the Space (what docker and microvm Spaces need).
VIA = ["host", "commands"]


@asynccontextmanager
async def lab(tmp: Path, backend: str, via: str = "host") -> AsyncIterator[Lab]:
    _need(backend)
    b = open_backend(backend, tmp / "spaces")
    try:
        space = await b.create(space_name(f"incr-{tmp.name}"))
        await space.advance_epoch(1)
        store = DirectoryCheckpointStore(tmp / "store")
        x = Lab(space, SettledSnapshots(b, store=store), store, tmp)
        if via == "commands":  # as if the workspace were not a directory here
            x.snaps.taker._seen(space).host = False
        await x.write(FILES)
        yield x
    finally:
        for name in await b.names():
            await b.delete(name)
        await b.close()


def blob_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def flip(path: Path) -> None:
    """Flip a byte of a blob file, or of a manifest file's manifest (not of the blobs
    it carries, ``checkpoints.carry``)."""
    data = bytearray(path.read_bytes())
    data[len(carry.split(bytes(data))) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def flip_carried(store: Path, sha: str) -> int:
    """Flip a byte of blob ``sha`` in every manifest file of ``store`` that carries it;
    how many did."""
    n = 0
    for path in store.glob("*.manifest"):
        data = bytearray(path.read_bytes())
        parsed = carry.entries(bytes(data))
        if parsed is not None and sha in parsed[1]:
            at, length = parsed[1][sha]
            data[at + length // 2] ^= 0x01
            path.write_bytes(bytes(data))
            n += 1
    return n


# --- cost follows the change -------------------------------------------------------------


@pytest.mark.parametrize("via", VIA)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_checkpoint_stores_only_what_changed_and_both_restore_exactly(
    tmp_path: Path, backend: str, via: str
) -> None:
    async with lab(tmp_path, backend, via) as x:
        first = await x.snaps.checkpoint(x.space, "call-1", 1)
        blobs = x.store_blobs()
        assert blobs == {blob_of(d) for d in FILES.values()}
        changed = {"d0/f000.txt": b"zero\n", "d1/f001.txt": b"one\n", "new/n.txt": b"new\n"}
        await x.write(changed)
        second = await x.snaps.checkpoint(x.space, "call-2", 1)
        added = x.store_blobs() - blobs
        assert added == {blob_of(d) for d in changed.values()}
        assert {p.name for p in (x.copy / "blobs").iterdir()} == x.store_blobs()
        await x.snaps.restore(x.space, first, 1)
        assert x.workspace() == FILES
        await x.snaps.restore(x.space, second, 1)
        assert x.workspace() == {**FILES, **changed}


# --- restores are verified ---------------------------------------------------------------


@pytest.mark.parametrize("via", VIA)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_tampered_blob_is_refused_named_and_the_intact_copy_restored(
    tmp_path: Path, backend: str, via: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with lab(tmp_path, backend, via) as x:
        cid = await x.snaps.checkpoint(x.space, "call-1", 1)
        sha = blob_of(FILES["d2/f002.txt"])
        store_blob = tmp_path / "store" / "blobs" / sha
        flip(store_blob)
        assert flip_carried(tmp_path / "store", sha) == 1  # its carrier too
        await x.write({"d2/f002.txt": b"changed\n"})
        with caplog.at_level(logging.WARNING, "durable_spaces.adapter.checkpoints.snapshots"):
            await x.snaps.restore(x.space, cid, 1)
        assert x.workspace() == FILES
        assert f"blob {sha}" in caplog.text and str(tmp_path / "store") in caplog.text
        assert blob_of(store_blob.read_bytes()) == sha  # mended from the intact copy


@pytest.mark.parametrize("via", VIA)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["flip-both", "gone-both", "manifest-flip-both"])
async def test_no_intact_blob_or_manifest_is_a_clear_error_and_changes_nothing(
    tmp_path: Path, backend: str, via: str, how: str
) -> None:
    async with lab(tmp_path, backend, via) as x:
        cid = CheckpointId.parse(await x.snaps.checkpoint(x.space, "call-1", 1))
        sha = blob_of(FILES["d3/f003.txt"])
        for d in (tmp_path / "store", x.copy):
            if how == "flip-both":
                flip(d / "blobs" / sha)
            elif how == "gone-both":
                (d / "blobs" / sha).unlink()
            else:
                flip(d / f"{cid}.manifest")
        if how != "manifest-flip-both":
            assert flip_carried(tmp_path / "store", sha) == 1  # the store's carrier too
        await x.write({"d3/f003.txt": b"changed\n"})
        before = x.workspace()
        with pytest.raises(CheckpointCorruptError) as e:
            await x.snaps.restore(x.space, cid, 1)
        msg = str(e.value)
        assert cid in msg
        if how == "manifest-flip-both":
            assert "does not match its id" in msg
        else:
            assert sha in msg and "d3/f003.txt" in msg and "no copy intact" in msg
        assert x.workspace() == before


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "path", ["../escaped", "/abs", "a/../../escaped", "l/under-link"], ids=lambda p: p
)
async def test_a_manifest_naming_a_path_out_of_the_workspace_is_refused(
    tmp_path: Path, backend: str, path: str
) -> None:
    """Its digest matches (the id was written by whoever wrote the manifest): the rules
    of the manifest itself refuse it, in every copy, before anything is extracted."""
    async with lab(tmp_path, backend) as x:
        data = b"pwned\n"
        sha = blob_of(data)
        rows = [
            [".", "d", 0o755, 0, None, 0],
            ["l", "l", 0o777, 0, str(tmp_path), 0],
            [path, "f", 0o644, len(data), sha, 0],
        ]
        rows.sort(key=lambda r: mf.path_key(str(r[0])))
        doc = {"format": mf.FORMAT, "version": mf.VERSION, "entries": rows}
        raw = json.dumps(doc, separators=(",", ":")).encode()
        cid = CheckpointId.for_manifest("evil", raw)
        with x.store.batch() as b:
            b.add(data)
            b.manifest(cid, raw)
        before = x.workspace()
        with pytest.raises(CheckpointCorruptError, match="manifest refused"):
            await x.snaps.restore(x.space, cid, 1)
        assert x.workspace() == before
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "under-link").exists()


# --- crash safety: a kill anywhere in a take or a prune ----------------------------------

#: The store's calls that change what is on disk: a kill before any of them leaves what
#: the ones before it did.
MUTATING = ("write", "replace", "unlink", "rename", "fsync", "mkdir", "rmdir", "link")


class Killed(BaseException):
    """The simulated kill (a BaseException: nothing on the path may swallow it)."""


class KillingOs(ModuleType):
    """``os`` for ``checkpoints.store``, ``checkpoints.batch`` and ``inode_pool``: its
    ``at``-th mutating call raises ``Killed`` and every later one fails (a dead process
    changes nothing more; the ``with`` blocks' own clean-up still closes descriptors,
    as the kernel would). The pool's own thread, making files ahead, is not counted:
    its calls come whenever it runs, and it names nothing."""

    def __init__(self, at: int) -> None:
        super().__init__("os")
        self.at, self.calls = at, 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if name not in MUTATING:
            return real

        def call(*args: Any, **kw: Any) -> Any:
            if threading.current_thread().name.startswith("ds-inode-pool"):
                return real(*args, **kw)
            self.calls += 1
            if self.calls == self.at:
                raise Killed(f"killed at {name} (call {self.calls})")
            if self.calls > self.at:
                raise OSError(5, "the process is dead")
            return real(*args, **kw)

        return call


@contextmanager
def killed_at(monkeypatch: pytest.MonkeyPatch, at: int) -> Iterator[KillingOs]:
    fake = KillingOs(at)
    with monkeypatch.context() as m:
        for module in (checkpoint_store, checkpoint_batch, inode_pool):
            m.setattr(module, "os", fake)
        yield fake


async def _no_spaces() -> AsyncIterator[Space]:
    return
    yield


def untar(data: bytes) -> dict[str, bytes]:
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        for m in t:
            f = t.extractfile(m) if m.isfile() else None
            if f is not None:
                out[m.name.removeprefix("./")] = f.read()
    return out


async def restorable(x: Lab, cid: str, want: dict[str, bytes]) -> None:
    """``cid`` reads back intact from a fresh view of the store alone, and of the
    Space's copy alone."""
    store_only = WorkspaceSnapshots(store=DirectoryCheckpointStore(x.tmp / "store"))
    assert untar(await store_only.read_intact(cid, _no_spaces())) == want, "store"

    async def spaces() -> AsyncIterator[Space]:
        yield x.space

    space_only = WorkspaceSnapshots()
    assert untar(await space_only.read_intact(cid, spaces())) == want, "the Space's copy"


def snapshot_dirs(x: Lab, to: Path) -> None:
    shutil.rmtree(to, ignore_errors=True)
    to.mkdir()
    shutil.copytree(x.tmp / "store", to / "store", symlinks=True)
    shutil.copytree(x.copy, to / "copy", symlinks=True)


def reset_dirs(x: Lab, saved: Path) -> None:
    for src, dst in ((saved / "store", x.tmp / "store"), (saved / "copy", x.copy)):
        shutil.rmtree(dst)
        shutil.copytree(src, dst, symlinks=True)


CHANGED = {"d0/f000.txt": b"zero\n", "d1/new.txt": b"new\n", "e/x.txt": b"x" * 70_000}


async def test_a_kill_anywhere_in_a_take_leaves_the_recorded_checkpoint_and_a_retake_sound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed at each write, rename and fsync of a take in turn: the checkpoint before it
    restores from the store and from the Space's copy, and taking it again (the same
    process, which remembered the tree) gives one that restores exactly."""
    async with lab(tmp_path, "local") as x:
        first = await x.snaps.checkpoint(x.space, "call-1", 1)
        for seen in x.snaps.taker.seen.values():
            seen.drop_kept()  # a journal is a live inotify instance: no copy of it exists
        remembered = copy.deepcopy(x.snaps.taker.seen)
        saved = tmp_path / "saved"
        snapshot_dirs(x, saved)
        await x.write(CHANGED)
        with killed_at(monkeypatch, 10**9) as probe:
            await x.snaps.checkpoint(x.space, "call-2", 1)
        assert probe.calls > 10  # blobs, the manifest, fsyncs, renames: each a kill point
        for at in range(1, probe.calls + 1):
            reset_dirs(x, saved)
            x.snaps.taker.seen = copy.deepcopy(remembered)
            with killed_at(monkeypatch, at), pytest.raises(Killed):
                await x.snaps.checkpoint(x.space, "call-2", 1)
            await restorable(x, first, FILES)
            second = await x.snaps.checkpoint(x.space, "call-2", 1)
            await restorable(x, second, {**FILES, **CHANGED})


async def test_a_kill_anywhere_in_a_prune_leaves_every_kept_checkpoint_restorable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three checkpoints sharing blobs, the middle one pruned: killed at each unlink and
    fsync of the prune in turn, the kept ones restore; a prune run to the end afterwards
    leaves exactly the blobs they name."""
    async with lab(tmp_path, "local") as x:
        trees, cids = [], []
        for i, change in enumerate([{}, CHANGED, {"d2/f002.txt": b"two\n"}]):
            await x.write(change)
            cids.append(await x.snaps.checkpoint(x.space, f"call-{i}", 1))
            trees.append(x.workspace())
        keep = [cids[0], cids[2]]
        needed = set().union(*(mf.blobs(mf.decode(x.store.get(c) or b"")) for c in keep))
        saved = tmp_path / "saved"
        snapshot_dirs(x, saved)
        with killed_at(monkeypatch, 10**9) as probe:
            DirectoryCheckpointStore(tmp_path / "store").prune(keep)
        assert probe.calls > 3
        for at in range(1, probe.calls + 1):
            reset_dirs(x, saved)
            with killed_at(monkeypatch, at), pytest.raises(Killed):
                DirectoryCheckpointStore(tmp_path / "store").prune(keep)
            for cid, tree in ((cids[0], trees[0]), (cids[2], trees[2])):
                await restorable(x, cid, tree)
            DirectoryCheckpointStore(tmp_path / "store").prune(keep)
            assert x.store_blobs() == needed
            assert x.store.ids() == sorted(CheckpointId.parse(c) for c in keep)
            for cid, tree in ((cids[0], trees[0]), (cids[2], trees[2])):
                await restorable(x, cid, tree)


async def test_a_prune_sigkilled_at_its_failpoint_leaves_the_kept_checkpoints(
    tmp_path: Path,
) -> None:
    """The same with a real SIGKILL, between the manifests' removal and the blobs'."""
    async with lab(tmp_path, "local") as x:
        first = await x.snaps.checkpoint(x.space, "call-1", 1)
        await x.write(CHANGED)
        await x.snaps.checkpoint(x.space, "call-2", 1)
        code = (
            "import sys; from durable_spaces.adapter.checkpoints.store import "
            "DirectoryCheckpointStore as S; S(sys.argv[1]).prune([sys.argv[2]])"
        )
        env = {**os.environ, "DS_FAILPOINTS": "checkpoint_store.prune:1"}
        p = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "store"), first],
            env=env, capture_output=True, timeout=60,
        )  # fmt: skip
        assert p.returncode == -9, p.stderr[-2000:]
        assert x.store.ids() == [CheckpointId.parse(first)]  # the manifest went, its blobs not
        assert len(x.store_blobs()) > len(FILES)
        await restorable(x, first, FILES)


async def test_a_prune_keeps_every_blob_when_a_kept_manifest_is_unreadable(
    tmp_path: Path,
) -> None:
    """A prune never guesses what a checkpoint needs: a damaged kept manifest (which a
    restore would mend from the Space's copy) keeps every blob."""
    async with lab(tmp_path, "local") as x:
        first = CheckpointId.parse(await x.snaps.checkpoint(x.space, "call-1", 1))
        await x.write(CHANGED)
        second = await x.snaps.checkpoint(x.space, "call-2", 1)
        flip(tmp_path / "store" / f"{first}.manifest")
        blobs = x.store_blobs()
        x.store.prune([first])
        assert x.store_blobs() == blobs and second not in x.store.ids()
        await x.write({"d0/f000.txt": b"other\n"})
        await x.snaps.restore(x.space, first, 1)  # from the Space's copy, the store mended
        assert x.workspace() == FILES
        x.store.prune([first])
        assert x.store_blobs() == {blob_of(d) for d in FILES.values()}


# --- what a workspace may hold --------------------------------------------------------


@pytest.mark.parametrize("via", VIA)
async def test_a_file_dated_before_1970_checkpoints_and_restores(tmp_path: Path, via: str) -> None:
    """Its mtime is negative: the manifest holds it and a restore reads it back (the
    decoder refused negative times, so such a checkpoint could be taken, never restored)."""
    async with lab(tmp_path, "local", via) as x:
        await x.write({"past.txt": b"old\n"})
        os.utime(x.root / "past.txt", ns=(-1_000_000_123_456_789, -1_000_000_123_456_789))
        cid = await x.snaps.checkpoint(x.space, "call-1", 1)
        await x.write({"past.txt": b"new\n"})
        await x.snaps.restore(x.space, cid, 1)
        assert (x.root / "past.txt").read_bytes() == b"old\n"
        assert abs(os.stat(x.root / "past.txt").st_mtime_ns + 1_000_000_123_456_789) < 1000


@pytest.mark.docker
@pytest.mark.parametrize("viewed", [True, False], ids=["host-view", "commands"])
async def test_an_unreadable_file_in_a_docker_space_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, viewed: bool
) -> None:
    """The Space's commands are not root there: a file of mode 000 cannot be read. Its
    tar's warning used to land inside the tar (a Space merges stderr into the output),
    a ``tarfile`` error; now the checkpoint says what it could not read. Read here
    through the container's root filesystem (``HostView``) it is read, and restored."""
    _need("docker")
    from durable_spaces.backends.docker.docker_space import DockerSpace

    if not viewed:
        monkeypatch.setattr(DockerSpace, "host_view", lambda self: None)
    b = open_backend("docker", tmp_path / "spaces")
    try:
        space = await b.create(space_name(f"incr-{tmp_path.name}"))
        await space.advance_epoch(1)
        snaps = SettledSnapshots(b, store=DirectoryCheckpointStore(tmp_path / "store"))
        await space.write_file("ok.txt", b"fine\n", epoch=1)
        await snaps.checkpoint(space, "call-1", 1)
        res = await space.exec(["sh", "-c", "printf z > zero && chmod 000 zero"], key=None,
                               epoch=1, cwd=space.root)  # fmt: skip
        assert res.exit_code == 0, res.output
        who = await space.exec(["id", "-u"], key=None, epoch=1, cwd=space.root)
        if who.output.strip() == b"0":
            pytest.skip("the docker Space's commands run as root: mode 000 is readable")
        if viewed and space.host_view() is None:  # type: ignore[attr-defined]
            pytest.skip("the engine shows no MergedDir here: no host view to read through")
        if not viewed:
            with pytest.raises(SpaceError, match=r"kept changing|gone when read"):
                await snaps.checkpoint(space, "call-2", 1)
            return
        cid = await snaps.checkpoint(space, "call-2", 1)
        await space.exec(["sh", "-c", "chmod 600 zero && printf changed > zero"], key=None,
                         epoch=1, cwd=space.root)  # fmt: skip
        await snaps.restore(space, cid, 1)
        st = await space.stat("zero")
        assert st is not None and st.mode == 0 and st.size == 1
    finally:
        for name in await b.names():
            await b.delete(name)
        await b.close()


# --- where the workspace is read ----------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
async def test_only_a_space_that_is_a_host_directory_by_construction_skips_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """``local`` (a ``HostWorkspace``) is read here with no probe command; a daemon's
    Space (spacesd) is proved by the probe first, since what it says of itself is the
    daemon's word; either way the checkpoint is read here and restores exactly."""
    from durable_spaces.adapter.checkpoints import incremental

    probes: list[str] = []
    real = incremental.probe_host

    async def spy(space: Space, epoch: int) -> bool:
        probes.append(space.name)
        return await real(space, epoch)

    monkeypatch.setattr(incremental, "probe_host", spy)
    async with lab(tmp_path, backend) as x:
        assert isinstance(x.space, HostWorkspace) == (backend == "local")
        cid = await x.snaps.checkpoint(x.space, "c1", 1)
        assert x.snaps.taker._seen(x.space).host is True
        assert probes == ([] if backend == "local" else [x.space.name])
        before = x.workspace()
        (x.root / "d0" / "f000.txt").write_bytes(b"changed\n")
        await x.snaps.restore(x.space, cid, 1)
        assert x.workspace() == before


async def test_a_host_workspace_whose_directory_is_gone_is_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim holds only while the directory is there: without it the probe decides
    (and says no), as for any Space."""
    from durable_spaces.adapter.checkpoints import incremental

    probes: list[str] = []

    async def spy(space: Space, epoch: int) -> bool:
        probes.append(space.name)
        return False

    monkeypatch.setattr(incremental, "probe_host", spy)
    async with lab(tmp_path, "local") as x:
        moved = x.root.with_name("moved-away")
        x.root.rename(moved)
        try:
            assert not await x.snaps.taker.is_host(x.space, 1)
        finally:
            moved.rename(x.root)
        assert probes == [x.space.name]
