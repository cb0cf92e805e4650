"""The small blobs a store's manifest file carries (``adapter/checkpoints/carry.py``).

A checkpoint is durable with one fsync because its manifest's file carries the bytes of
its small new blobs; their own files are written unsynced. What must hold, checked on a
real directory and on powerfs (a real FUSE mount that drops what was never synced):

- the format round-trips and refuses what does not fill it exactly;
- a blob file missing or damaged is read from its carrier and mended, with a warning;
- a carrier goes (``prune``, ``delete``) or is replaced only after what it carries and
  the rest still need is synced in ``blobs/``;
- after a power cut every blob a durable manifest names is readable intact; the same
  check with the carried bytes left out of the file (a mutant) loses blobs.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_spaces.adapter.checkpoints import batch as checkpoint_batch
from durable_spaces.adapter.checkpoints import carry
from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.adapter.checkpoints.store import DirectoryCheckpointStore
from durable_spaces.chaos.powerfs import PowerFSError, mount


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_of(files: dict[str, bytes]) -> bytes:
    """A real manifest naming ``files`` (so a prune reads what it needs)."""
    m: mf.Manifest = {".": mf.ManifestEntry(mf.DIR, 0o755, 0, None, 0)}
    for path, data in files.items():
        m[path] = mf.ManifestEntry(mf.FILE, 0o644, len(data), sha(data), 0)
    return mf.encode(m)


def checkpoint(store: DirectoryCheckpointStore, call: str, files: dict[str, bytes]) -> str:
    """One batch as a checkpoint writes it: the new blobs, then the manifest."""
    data = manifest_of(files)
    cid = CheckpointId.for_manifest(call, data)
    with store.batch() as b:
        for blob in files.values():
            b.add(blob)
        b.manifest(cid, data)
    return str(cid)


SMALL = {f"f{i}.txt": f"small file {i}\n".encode() * (i + 1) for i in range(6)}
LARGE = {"big.bin": os.urandom(checkpoint_batch.CLONE_MIN + 100)}


# --- the format ----------------------------------------------------------------------


def test_the_format_round_trips_and_refuses_what_does_not_fill_it() -> None:
    """Every entry read is checked against the file's bounds; a count no file of this
    size could hold is refused at once (``walk`` reads no header of it)."""
    manifest = b'{"format":"durable-spaces.manifest"}'
    blobs = [(sha(b"a"), b"a"), (sha(b"bc" * 100), b"bc" * 100)]
    data = manifest + carry.trailer(len(manifest), blobs)
    assert carry.split(data) == manifest
    for s, blob in blobs:
        assert carry.carried(data, s) == blob
    assert carry.carried(data, sha(b"other")) is None
    assert carry.split(manifest) == manifest  # nothing carried: all of it
    bad = bytearray(data)
    bad[len(manifest) + 40] ^= 1  # a carried byte: the blob is refused, the rest stands
    assert carry.carried(bytes(bad), blobs[0][0]) is None
    assert carry.split(bytes(bad)) == manifest
    for broken in (
        data[1:],  # the entries no longer fill it
        data[:-1],  # no footer
        data[:-16] + (10**9).to_bytes(8, "big") + data[-8:],  # a manifest past the end
        data[:-8] + (2**40).to_bytes(8, "big"),  # more entries than bytes
        data[:-8] + (3).to_bytes(8, "big"),  # more entries than there are
    ):
        assert carry.entries(broken) is None
        assert carry.split(broken) == broken
    reads: list[int] = []
    huge = manifest + b"x" * 400 + carry.FOOTER.pack(carry.MAGIC, len(manifest), 11)
    assert carry.walk(len(huge), lambda at, n: reads.append(at) or huge[at : at + n]) is None
    assert len(reads) == 1  # the footer only: 11 headers do not fit in 400 bytes


# --- a store on a directory ------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> DirectoryCheckpointStore:
    return DirectoryCheckpointStore(tmp_path / "store")


def test_small_blobs_are_carried_large_ones_are_not(store: DirectoryCheckpointStore) -> None:
    cid = checkpoint(store, "call-1", {**SMALL, **LARGE})
    data = (store.dir / f"{cid}.manifest").read_bytes()
    parsed = carry.entries(data)
    assert parsed is not None
    assert set(parsed[1]) == {sha(b) for b in SMALL.values()}
    assert store.get(cid) == manifest_of({**SMALL, **LARGE})
    for blob in [*SMALL.values(), *LARGE.values()]:  # every blob has its own file too
        assert (store.dir / "blobs" / sha(blob)).read_bytes() == blob


def test_a_blob_file_missing_or_damaged_is_read_from_its_carrier_and_mended(
    store: DirectoryCheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    cid = checkpoint(store, "call-1", SMALL)
    gone, damaged = (sha(SMALL["f1.txt"]), sha(SMALL["f2.txt"]))
    (store.dir / "blobs" / gone).unlink()
    (store.dir / "blobs" / damaged).write_bytes(b"\0" * len(SMALL["f2.txt"]))
    with caplog.at_level(logging.WARNING):
        assert store.get_blob(gone) == SMALL["f1.txt"]
        assert store.get_blob(damaged) == SMALL["f2.txt"]
    assert f"{gone} is missing" in caplog.text and f"{damaged} is damaged" in caplog.text
    assert cid in caplog.text
    assert (store.dir / "blobs" / gone).read_bytes() == SMALL["f1.txt"]  # mended
    assert (store.dir / "blobs" / damaged).read_bytes() == SMALL["f2.txt"]
    # No carrier holds it intact either: what is there is returned, callers refuse it.
    path = store.dir / f"{cid}.manifest"
    data = bytearray(path.read_bytes())
    at, _ = carry.entries(bytes(data))[1][gone]  # type: ignore[index]
    data[at] ^= 1
    path.write_bytes(bytes(data))
    (store.dir / "blobs" / gone).unlink()
    assert store.get_blob(gone) is None


def _later_needs_carried_blob(store: DirectoryCheckpointStore) -> tuple[str, str, str]:
    """Two checkpoints: the second names a blob only the first carries (its file was
    there, so the second did not carry it); that file then loses its bytes, as a power
    cut leaves a file never synced. Returns (first, second, the blob)."""
    first = checkpoint(store, "call-1", SMALL)
    second = checkpoint(store, "call-2", {**SMALL, "new.txt": b"new\n"})
    parsed = carry.entries((store.dir / f"{second}.manifest").read_bytes())
    assert parsed is not None and set(parsed[1]) == {sha(b"new\n")}
    blob = sha(SMALL["f3.txt"])
    (store.dir / "blobs" / blob).write_bytes(b"")
    return first, second, blob


def test_a_prune_syncs_what_a_carrier_it_deletes_holds_for_the_rest(
    store: DirectoryCheckpointStore,
) -> None:
    _, second, blob = _later_needs_carried_blob(store)
    store.prune([second])
    assert [str(c) for c in store.ids()] == [second]
    assert (store.dir / "blobs" / blob).read_bytes() == SMALL["f3.txt"]  # written again
    assert store.get_blob(blob) == SMALL["f3.txt"]


def test_a_delete_and_a_rewrite_of_a_carrier_sync_what_it_holds(
    store: DirectoryCheckpointStore,
) -> None:
    first, _, blob = _later_needs_carried_blob(store)
    # A manifest written again over its carrier (a copy mended) with nothing carried.
    with store.batch() as b:
        b.manifest(CheckpointId.parse(first), manifest_of(SMALL))
    assert (store.dir / "blobs" / blob).read_bytes() == SMALL["f3.txt"]
    assert carry.entries((store.dir / f"{first}.manifest").read_bytes()) is None
    # And a carrier deleted.
    first = checkpoint(store, "call-9", {"nine.txt": b"nine\n"})
    blob = sha(b"nine\n")
    (store.dir / "blobs" / blob).write_bytes(b"")
    store.delete(first)
    assert (store.dir / "blobs" / blob).read_bytes() == b"nine\n"


def test_a_blob_file_appears_only_once_its_carrier_is_durable(
    store: DirectoryCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order a later batch relies on (it does not carry a blob whose file it finds):
    the manifest renamed and its directory fsynced before any carried blob's rename."""
    events: list[str] = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(src: str, dst: str, **kw: int) -> None:
        events.append("manifest" if dst.endswith(".manifest") else "blob")
        real_replace(src, dst, **kw)

    def fsync(fd: int) -> None:
        if os.path.samefile(f"/proc/self/fd/{fd}", store.dir):
            events.append("dir")
        real_fsync(fd)

    checkpoint(store, "call-0", {})  # the directories made before the look
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    checkpoint(store, "call-1", SMALL)
    assert events == ["manifest", "dir", *["blob"] * len(SMALL)], events


# --- a store on a disk that loses power ----------------------------------------------------


@contextlib.contextmanager
def powered(base: Path) -> Iterator[tuple[object, Path]]:
    backing, root = base / "backing", base / "mnt"
    backing.mkdir(parents=True)
    root.mkdir()
    fs = mount(backing, root, state_dir=base / "s")
    try:
        yield fs, root
    finally:
        with contextlib.suppress(PowerFSError):
            fs.unmount(sync=False)


@pytest.mark.fuse
@pytest.mark.parametrize("mutant", [False, True], ids=["carried", "mutant-not-carried"])
def test_after_a_power_cut_every_blob_of_a_durable_manifest_is_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutant: bool
) -> None:
    """Two checkpoints (the second relying on blob files the first carries), a prune of
    the first, a third; then the power goes. Every manifest that came back must restore
    whole. ``mutant``: the manifest's file leaves the carried bytes out (its blobs still
    unsynced): the check must then find blobs lost, or it proves nothing."""
    if mutant:
        monkeypatch.setattr(carry, "trailer", lambda n, blobs: carry.FOOTER.pack(carry.MAGIC, n, 0))
    with powered(tmp_path) as (fs, root):
        store = DirectoryCheckpointStore(root / "store")
        trees = {checkpoint(store, "call-1", {**SMALL, **LARGE}): {**SMALL, **LARGE}}
        second = {**SMALL, **LARGE, "two.txt": b"two\n" * 50}
        trees[checkpoint(store, "call-2", second)] = second
        store.prune(list(trees)[1:])
        third = {**second, "three.txt": b"three\n"}
        trees[checkpoint(store, "call-3", third)] = third
        fs.cut(tear=True)  # type: ignore[attr-defined]
        store = DirectoryCheckpointStore(root / "store")
        back = {str(c) for c in store.ids()}
        lost = []
        for cid in back:
            assert CheckpointId.parse(cid).matches(store.get(cid) or b"")
            for blob in trees[cid].values():
                if store.get_blob(sha(blob)) != blob:
                    lost.append((cid, sha(blob)))
    assert len(back) >= 1 or mutant
    if mutant:
        assert lost, "the check found nothing lost with the carried bytes left out"
    else:
        assert back == set(list(trees)[1:]) and not lost, lost
