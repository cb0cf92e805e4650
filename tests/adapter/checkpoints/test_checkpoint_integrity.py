"""Checkpoints are never trusted blindly ("every input checked, nothing lost").

A workspace checkpoint's id records its tar's sha256; every copy (the store's, the one
beside the workspace, a fork parent's) is checked against it and against
``check_archive`` before anything is extracted, and the first intact one wins. No intact
copy, or an id from the log that does not parse, ends the driver with 78, never as a
tool result. Real parts throughout: real local and cua-spacesd Spaces, real driver
processes killed at failpoints (``drive.py``), real files planted where an attacker or a
crash would put them. Both backends keep the workspace at a host path (``Space.root``),
so copies inside a Space are tampered with from the host.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import shutil
import sqlite3
import stat
import subprocess
import tarfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from drive import AGENT, cleanup, driver_env, setup
from needs import need

from durable_spaces.adapter.checkpoints import carry
from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.adapter.checkpoints.snapshots import (
    CheckpointMissing,
    DirectoryCheckpointStore,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.space_state import CallRecord, SpaceState
from durable_spaces.backends import open_backend
from durable_spaces.backends.microvm.backend import MicrovmBackend
from durable_spaces.errors import (
    BadCheckpointIdError,
    CheckpointCopyError,
    CheckpointCorruptError,
    PermanentFailure,
)
from durable_spaces.space import Space, space_name
from tests.adapter.settled import SettledSnapshots

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("spacesd", marks=pytest.mark.spacesd, id="spacesd"),
]

#: Ids a damaged (or hostile) log could hold.
MALFORMED = {
    "traversal": "../../etc",
    "shell": "x; rm -rf /",
    "empty": "",
    "10kb": "a" * 10240,
}
GOOD_WS = "call-1-" + "0" * 64


def fname(cid: str | None) -> str:
    """A checkpoint's file name in a store or a Space's copy."""
    c = CheckpointId.parse(cid)
    return f"{c}{c.suffix}"


def _need(backend: str) -> None:
    need(backend)


# --- ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("call-1-" + "ab" * 32, "workspace"),
        ("call_s0-before-" + "0" * 32, "workspace"),
        ("call-s0-0123456789abcdef", "workspace"),  # the old 16-digit form still reads
        ("0123456789abcdef01234567", "machine"),
    ],
    ids=["new", "32-digits", "legacy-16", "machine"],
)
def test_valid_ids_parse_with_their_kind(value: str, kind: str) -> None:
    assert CheckpointId.parse(value).kind == kind


@pytest.mark.parametrize(
    "value",
    [
        *MALFORMED.values(),
        "call-1-" + "0" * 20,  # a digest of neither length
        "call-1-" + "A" * 64,  # upper case is not what ids are made of
        "0123456789abcdef01234567\n",  # `$` would have let the newline through
        "call/1-" + "0" * 64,
        None,
        7,
    ],
    ids=[*MALFORMED, "short-digest", "uppercase", "trailing-newline", "slash", "none", "int"],
)
def test_malformed_ids_are_refused_with_a_bounded_message(value: object) -> None:
    with pytest.raises(BadCheckpointIdError) as e:
        CheckpointId.parse(value, "test")
    assert isinstance(e.value, PermanentFailure)
    assert len(str(e.value)) < 200


def test_new_ids_record_the_whole_sha256() -> None:
    cid = CheckpointId.for_tar("call/../1", b"tar bytes")
    assert cid.digest == hashlib.sha256(b"tar bytes").hexdigest()
    assert "/" not in cid and cid.matches(b"tar bytes") and not cid.matches(b"tar bytez")


@pytest.mark.parametrize("name", MALFORMED)
@pytest.mark.parametrize("field", ["last_checkpoint", "before", "checkpoint"])
def test_malformed_ids_in_the_log_are_a_permanent_failure(name: str, field: str) -> None:
    rec = CallRecord("c1", "write", 1, before=GOOD_WS, checkpoint=GOOD_WS).to_json()
    doc = {"mode": "checkpoint", "last_checkpoint": GOOD_WS, "calls": {"c1": rec}}
    if field == "last_checkpoint":
        doc[field] = MALFORMED[name]
    else:
        rec[field] = MALFORMED[name]
    with pytest.raises(BadCheckpointIdError, match="malformed checkpoint id") as e:
        SpaceState.from_json(doc)
    assert "checkpoint" in str(e.value) and len(str(e.value)) < 300


@pytest.mark.parametrize("name", MALFORMED)
def test_the_store_refuses_malformed_ids_and_writes_nothing(tmp_path: Path, name: str) -> None:
    store = DirectoryCheckpointStore(tmp_path / "store")
    bad = MALFORMED[name]
    for op in (lambda: store.put(bad, b"x"), lambda: store.get(bad), lambda: store.delete(bad)):
        with pytest.raises(BadCheckpointIdError):
            op()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    assert list((tmp_path / "store").iterdir()) == []


@pytest.mark.parametrize("bad", ["../../x" + "0" * 24, "0123456789abcdef01234567\n", GOOD_WS])
def test_microvm_checkpoint_dirs_take_only_machine_ids(tmp_path: Path, bad: str) -> None:
    host = SimpleNamespace(state_dir=tmp_path)  # the path half needs no running QEMU
    good = MicrovmBackend._ckpt_dir(host, "0123456789abcdef01234567")  # type: ignore[arg-type]
    assert good == tmp_path / "checkpoints" / "0123456789abcdef01234567"
    with pytest.raises(BadCheckpointIdError):
        MicrovmBackend._ckpt_dir(host, bad)  # type: ignore[arg-type]


# --- the store's files --------------------------------------------------------------------


def test_store_files_are_0600_in_a_0700_directory(tmp_path: Path) -> None:
    d = tmp_path / "store"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    store = DirectoryCheckpointStore(d)
    cid = CheckpointId.for_tar("c", b"data")
    store.put(cid, b"data")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / f"{cid}.tar").stat().st_mode) == 0o600
    assert store.get(cid) == b"data" and store.ids() == [cid]
    with pytest.raises(CheckpointCopyError):
        store.put(cid, b"other")  # bytes that are not this checkpoint are never stored


@pytest.mark.parametrize("planted", ["symlink", "directory", "fifo"])
def test_store_get_refuses_what_is_not_a_regular_file(tmp_path: Path, planted: str) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    store = DirectoryCheckpointStore(tmp_path / "store")
    cid = CheckpointId.for_tar("c", b"data")
    path = tmp_path / "store" / f"{cid}.tar"
    {"symlink": lambda: path.symlink_to(outside), "directory": path.mkdir,
     "fifo": lambda: os.mkfifo(path)}[planted]()  # fmt: skip
    with pytest.raises(CheckpointCopyError, match="not a regular file"):
        store.get(cid)  # a FIFO would block a plain open: this returns at once
    if planted != "directory":
        store.put(cid, b"data")  # a bad copy is replaced, its target never written
        assert store.get(cid) == b"data" and not path.is_symlink()
    assert outside.read_bytes() == b"secret"


def test_store_listing_skips_names_that_are_not_ids(tmp_path: Path) -> None:
    store = DirectoryCheckpointStore(tmp_path / "store")
    cid = CheckpointId.for_tar("c", b"data")
    store.put(cid, b"data")
    for junk in ("x; rm -rf .tar", "..tar", ".tmp-1"):
        (tmp_path / "store" / junk).write_bytes(b"")
    assert store.ids() == [cid]


# --- restores through real Spaces ----------------------------------------------------------

FILES = {"a.txt": b"alpha\n", "d/b.txt": b"bravo\n" * 100}


@dataclass
class Lab:
    space: Space
    snaps: WorkspaceSnapshots
    store: DirectoryCheckpointStore
    cid: CheckpointId  # a checkpoint of FILES plus the symlink "l" -> a.txt
    tmp: Path

    @property
    def root(self) -> Path:
        return Path(self.space.root)

    def store_copy(self, cid: str | None = None) -> Path:
        c = CheckpointId.parse(cid or self.cid)
        return self.tmp / "store" / f"{c}{c.suffix}"

    def space_copy(self, cid: str | None = None) -> Path:
        c = CheckpointId.parse(cid or self.cid)
        return self.root.parent / ".ds-checkpoints" / f"{c}{c.suffix}"

    def workspace(self) -> dict[str, bytes]:
        out = {}
        for p in sorted(self.root.rglob("*")):
            rel = str(p.relative_to(self.root))
            if p.is_symlink():
                out[rel] = b"-> " + os.readlink(p).encode()
            elif p.is_file():
                out[rel] = p.read_bytes()
        return out

    async def mess_up(self) -> None:
        """Change the workspace after the checkpoint (a restore must undo this)."""
        await self.space.write_file("a.txt", b"changed\n", epoch=1)
        await self.space.write_file("new.txt", b"new\n", epoch=1)


def expected() -> dict[str, bytes]:
    """The workspace as the lab's checkpoint holds it."""
    return dict(sorted({**FILES, "l": b"-> a.txt"}.items()))


@asynccontextmanager
async def lab(tmp: Path, backend: str, store: bool = True) -> AsyncIterator[Lab]:
    _need(backend)
    b = open_backend(backend, tmp / "spaces")
    try:
        space = await b.create(space_name(f"integrity-{tmp.name}"))
        await space.advance_epoch(1)
        for path, data in FILES.items():
            await space.write_file(path, data, epoch=1)
        await space.symlink("l", "a.txt", epoch=1)
        st = DirectoryCheckpointStore(tmp / "store")
        snaps = SettledSnapshots(b, store=st if store else None)
        cid = CheckpointId.parse(await snaps.checkpoint(space, "call-1", 1))
        yield Lab(space, snaps, st, cid, tmp)
    finally:
        for name in await b.names():
            await b.delete(name)
        await b.close()


async def _no_spaces() -> AsyncIterator[Space]:
    return
    yield


def _other_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("./other.txt")
        info.size = 6
        t.addfile(info, io.BytesIO(b"other\n"))
    return buf.getvalue()


def tamper(path: Path, how: str) -> None:
    """Damage one copy the way a crash, a bug or an agent could."""
    if how == "flip":  # in a manifest file, its manifest (not the blobs it carries)
        data = bytearray(path.read_bytes())
        data[len(carry.split(bytes(data))) // 3] ^= 0x01
        path.write_bytes(bytes(data))
    elif how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "other-tar":
        path.write_bytes(_other_tar())
    elif how == "symlink":
        path.unlink()
        path.symlink_to("/etc/passwd")
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:
        raise AssertionError(how)


TAMPER = ["flip", "truncate", "other-tar", "symlink", "directory"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", TAMPER)
async def test_a_bad_store_copy_restores_the_intact_one_in_the_space(
    tmp_path: Path, backend: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with lab(tmp_path, backend) as x:
        await x.mess_up()
        tamper(x.store_copy(), how)
        with caplog.at_level(logging.WARNING, "durable_spaces.adapter.checkpoints.snapshots"):
            await x.snaps.restore(x.space, x.cid, 1)
        assert x.workspace() == expected()
        assert str(x.store_copy()) in caplog.text  # the bad copy is named
        if how != "directory":  # a file in its place again, intact
            assert x.store.get(x.cid) is not None
            assert x.cid.matches(carry.split(x.store_copy().read_bytes()))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["flip", "other-tar", "symlink"])
async def test_no_intact_copy_is_a_permanent_failure_and_changes_nothing(
    tmp_path: Path, backend: str, how: str
) -> None:
    async with lab(tmp_path, backend) as x:
        await x.mess_up()
        before = x.workspace()
        tamper(x.store_copy(), how)
        tamper(x.space_copy(), "truncate")
        with pytest.raises(CheckpointCorruptError) as e:
            await x.snaps.restore(x.space, x.cid, 1)
        msg = str(e.value)
        assert x.cid in msg and str(x.store_copy()) in msg and str(x.space_copy()) in msg
        assert isinstance(e.value, PermanentFailure)
        assert x.workspace() == before


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["flip", "fifo"])
async def test_without_a_store_a_bad_copy_in_the_space_never_restores_or_hangs(
    tmp_path: Path, backend: str, how: str
) -> None:
    async with lab(tmp_path, backend, store=False) as x:
        await x.mess_up()
        tamper(x.space_copy(), how)
        with pytest.raises(CheckpointCorruptError, match="Space"):
            await asyncio.wait_for(x.snaps.restore(x.space, x.cid, 1), 60)
        assert x.workspace()["a.txt"] == b"changed\n"  # nothing was extracted
        x.space_copy().unlink()
        with pytest.raises(CheckpointMissing):
            await x.snaps.restore(x.space, x.cid, 1)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_fork_restores_from_its_parent_when_its_own_copy_is_bad(
    tmp_path: Path, backend: str
) -> None:
    async with lab(tmp_path, backend, store=False) as x:
        intact = x.space_copy().read_bytes()
        parent = await open_backend(backend, tmp_path / "spaces").create(space_name("parent"))
        await parent.advance_epoch(3)
        theirs = Path(parent.root).parent / ".ds-checkpoints"
        shutil.copytree(x.space_copy().parent, theirs, dirs_exist_ok=True)
        await x.mess_up()
        tamper(x.space_copy(), "flip")
        await x.snaps.restore(x.space, x.cid, 1, source=parent)
        assert x.workspace() == expected()
        assert x.space_copy().read_bytes() == intact  # mended from the parent's copy
        assert await parent.current_epoch() == 3  # read at the parent's floor


Member = tuple[tarfile.TarInfo, bytes]


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    data = b"pwned\n" if kind == tarfile.REGTYPE else b""
    info.size = len(data)
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    return info, data


def _evil(tmp: Path, root: Path, case: str) -> bytes:
    sentinel, escaped = tmp / "sentinel", tmp / "escaped"
    members = {
        "dotdot": [_member(os.path.relpath(escaped, root))],
        "absolute": [_member(str(escaped))],
        "under-symlink": [_member("./l", tarfile.SYMTYPE, str(tmp)), _member("./l/escaped")],
        "hardlink-out": [_member("./h", tarfile.LNKTYPE, str(sentinel))],
        "hardlink-dotdot": [_member("./h", tarfile.LNKTYPE, os.path.relpath(sentinel, root))],
        "hardlink-via-symlink": [
            _member("./l", tarfile.SYMTYPE, str(tmp)),
            _member("./h", tarfile.LNKTYPE, "l/sentinel"),
        ],
        "device": [_member("./null", tarfile.CHRTYPE)],
        "fifo": [_member("./pipe", tarfile.FIFOTYPE)],
    }[case]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        t.addfile(*_as_file(_member("./a.txt")))
        for info, data in members:
            t.addfile(*_as_file((info, data)))
    return buf.getvalue()


def _as_file(m: Member) -> tuple[tarfile.TarInfo, io.BytesIO | None]:
    return m[0], io.BytesIO(m[1]) if m[1] else None


EVIL = [
    "dotdot",
    "absolute",
    "under-symlink",
    "hardlink-out",
    "hardlink-dotdot",
    "hardlink-via-symlink",
    "device",
    "fifo",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", EVIL)
async def test_a_malicious_archive_is_refused_and_nothing_outside_is_written(
    tmp_path: Path, backend: str, case: str
) -> None:
    """Even with a matching digest (an attacker who wrote the log too), both copies."""
    sentinel = tmp_path / "sentinel"
    sentinel.write_bytes(b"untouched\n")
    async with lab(tmp_path, backend) as x:
        data = _evil(tmp_path, x.root, case)
        cid = CheckpointId.for_tar("evil", data)
        x.store.put(cid, data)
        x.space_copy(cid).write_bytes(data)
        before = x.workspace()
        with pytest.raises(CheckpointCorruptError, match="refused"):
            await x.snaps.restore(x.space, cid, 1)
        assert x.workspace() == before
    assert sentinel.read_bytes() == b"untouched\n" and sentinel.stat().st_nlink == 1
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_archive_tar_cannot_extract_leaves_the_workspace_alone(
    tmp_path: Path, backend: str
) -> None:
    """check_archive passes it (a file, then a file "under" it), GNU tar fails on it: the
    extraction is staged, so the workspace is never half replaced."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.addfile(*_as_file(_member("./x")))
        t.addfile(*_as_file(_member("./x/y")))
    data = buf.getvalue()
    async with lab(tmp_path, backend) as x:
        cid = CheckpointId.for_tar("odd", data)
        x.store.put(cid, data)
        before = x.workspace()
        with pytest.raises(CheckpointCorruptError, match="tar -x failed"):
            await x.snaps.restore(x.space, cid, 1)
        assert x.workspace() == before
        assert not list((x.root.parent / ".ds-checkpoints").glob(".restore-*"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("special", ["fifo", "socket", "device"])
async def test_special_files_are_left_out_of_checkpoints(
    tmp_path: Path, backend: str, special: str
) -> None:
    async with lab(tmp_path, backend) as x:
        path = x.root / "d" / "special"
        kind = {"fifo": stat.S_IFIFO, "socket": stat.S_IFSOCK, "device": stat.S_IFCHR}[special]
        try:
            os.mknod(path, 0o600 | kind, os.makedev(1, 3))  # a device: /dev/null's numbers
        except PermissionError:
            pytest.skip(f"cannot make a {special} node here (no CAP_MKNOD)")
        cid = await asyncio.wait_for(x.snaps.checkpoint(x.space, "call-2", 1), 60)
        names = mf.decode(x.store_copy(cid).read_bytes())
        assert "d/special" not in names and "d/b.txt" in names
        await x.mess_up()
        await asyncio.wait_for(x.snaps.restore(x.space, cid, 1), 60)
        assert x.workspace() == expected() and not path.exists()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("planted", ["fifo-pending", "dir-pending", "dir-final"])
async def test_what_is_planted_beside_the_workspace_never_blocks_a_checkpoint(
    tmp_path: Path, backend: str, planted: str
) -> None:
    async with lab(tmp_path, backend) as x:
        ckpts = x.root.parent / ".ds-checkpoints"
        if planted == "fifo-pending":
            os.mkfifo(ckpts / ".pending-call-2.tar")  # tee would block opening it
        elif planted == "dir-pending":
            (ckpts / ".pending-call-2.tar" / "sub").mkdir(parents=True)
        else:  # the same tree gives the same id: plant a directory at its final name
            first = await x.snaps.checkpoint(x.space, "call-2", 1)
            x.space_copy(first).unlink()
            (ckpts / f"{first}.tar" / "sub").mkdir(parents=True)  # mv would move into it
        cid = await asyncio.wait_for(x.snaps.checkpoint(x.space, "call-2", 1), 60)
        assert x.space_copy(cid).is_file() and cid.matches(x.space_copy(cid).read_bytes())


@pytest.mark.parametrize("backend", BACKENDS)
async def test_checkpoints_with_the_old_16_digit_ids_still_restore(
    tmp_path: Path, backend: str
) -> None:
    async with lab(tmp_path, backend) as x:
        data = await x.snaps.read_intact(x.cid, _no_spaces())  # the tar an old adapter kept
        old = CheckpointId.parse(f"call-1-{hashlib.sha256(data).hexdigest()[:16]}")
        x.space_copy(old).write_bytes(data)  # what an older adapter left in the Space
        await x.mess_up()
        await x.snaps.restore(x.space, old, 1)
        assert x.workspace() == expected()
        x.space_copy(old).write_bytes(_other_tar())
        with pytest.raises(CheckpointCorruptError, match="does not match its id"):
            await x.snaps.restore(x.space, old, 1)


async def test_review_reads_only_intact_copies(tmp_path: Path) -> None:
    """``workspace_at`` (and ``durable-spaces diff``) verify copies like a restore."""
    from durable_spaces.adapter.review import workspace_at
    from durable_spaces.errors import ReviewError

    from .test_workspace_checkpoint_pruning import session

    async with session(tmp_path, store=True) as run:
        last = [e for e in run.root.entries() if e.kind == "tool_result"][-1]
        want = await workspace_at(run.harness, run.durable, run.root.id, last.id)
        cid = SpaceState.from_json(run.root.document("cua.space", as_of=last.id)).last_checkpoint
        tamper(tmp_path / "store" / fname(cid), "other-tar")
        assert await workspace_at(run.harness, run.durable, run.root.id, last.id) == want
        tamper(run.checkpoints_dir / fname(cid), "flip")
        with pytest.raises(ReviewError, match=f"no intact copy of checkpoint {cid}"):
            await workspace_at(run.harness, run.durable, run.root.id, last.id)


# --- real drivers ----------------------------------------------------------------------------

#: Attempt 1 dies after the second call's write: attempt 2 restores the checkpoint before it.
KILL = "adapter.file_op:2"


def run_driver(tmp: Path, epoch: int, failpoints: str = "") -> subprocess.CompletedProcess[str]:
    env = driver_env(tmp, epoch, failpoints=failpoints)
    return subprocess.run(AGENT, env=env, capture_output=True, text=True, timeout=180)


def commits(tmp: Path) -> list[tuple[int, list[dict[str, object]]]]:
    db = sqlite3.connect(tmp / "state" / "log.sqlite")
    try:
        return [(s, json.loads(o)) for s, o in db.execute("SELECT seq, ops FROM cua_commits")]
    finally:
        db.close()


def space_doc(tmp: Path) -> tuple[int, dict[str, object]]:
    """The newest ``cua.space`` document (and its commit)."""
    for seq, ops in reversed(commits(tmp)):
        for op in ops:
            if op.get("op") == "doc" and op.get("name") == "cua.space":
                return seq, op["value"]  # type: ignore[return-value]
    raise AssertionError("no cua.space document")


def plant(tmp: Path, edit: Callable[[dict[str, object]], None]) -> None:
    """Rewrite the newest ``cua.space`` document in place (a damaged log)."""
    seq, _ = space_doc(tmp)
    db = sqlite3.connect(tmp / "state" / "log.sqlite")
    try:
        (text,) = db.execute("SELECT ops FROM cua_commits WHERE seq = ?", (seq,)).fetchone()
        ops = json.loads(text)
        for op in ops:
            if op.get("op") == "doc" and op.get("name") == "cua.space":
                edit(op["value"])
        db.execute("UPDATE cua_commits SET ops = ? WHERE seq = ?", (json.dumps(ops), seq))
        db.commit()
    finally:
        db.close()


def killed_session(tmp: Path, backend: str) -> tuple[Path, str]:
    """A checkpoint-mode session killed mid-call: the workspace root and the id of the
    checkpoint the next driver must restore."""
    _need(backend)
    setup(tmp, backend, "checkpoint", calls=4)
    assert run_driver(tmp, 1, KILL).returncode == -9
    _, doc = space_doc(tmp)
    calls = doc["calls"]
    assert isinstance(calls, dict)
    (pending,) = [c for c in calls.values() if "outcome" not in c]
    (root,) = (tmp / "spaces").glob("*/work")
    return root, str(pending["before"])


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["flip", "symlink"])
def test_driver_restores_the_intact_copy_when_the_store_is_tampered(
    tmp_path: Path, backend: str, how: str
) -> None:
    from drive import check

    _, cid = killed_session(tmp_path, backend)
    try:
        for copy in (tmp_path / "store").glob("*.manifest"):
            tamper(copy, how)
        p = run_driver(tmp_path, 2)
        assert p.returncode == 0, p.stderr[-2000:]
        assert str(tmp_path / "store" / fname(cid)) in p.stderr  # the warning names it
        assert '"kind": "restored"' in p.stdout
        verdicts = asyncio.run(check(tmp_path, backend))
        assert all(v.get("valid") is True for v in verdicts.values()), verdicts
        assert CheckpointId.parse(cid).matches(
            carry.split((tmp_path / "store" / fname(cid)).read_bytes())
        )
    finally:
        asyncio.run(cleanup(tmp_path, backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_driver_exits_78_when_no_copy_is_intact(tmp_path: Path, backend: str) -> None:
    root, cid = killed_session(tmp_path, backend)
    try:
        tamper(tmp_path / "store" / fname(cid), "flip")
        tamper(root.parent / ".ds-checkpoints" / fname(cid), "other-tar")
        workspace, (seq, doc), before = tree(root), space_doc(tmp_path), commits(tmp_path)
        p = run_driver(tmp_path, 2)
        assert p.returncode == 78, p.stderr[-2000:]
        assert f"no intact copy of checkpoint {cid}" in p.stderr
        assert "Traceback" not in p.stderr
        assert tree(root) == workspace
        assert space_doc(tmp_path) == (seq, doc)
        new = [op for _, ops in commits(tmp_path)[len(before) :] for op in ops]
        assert not [op for op in new if op.get("op") in ("entry", "doc")], new
    finally:
        asyncio.run(cleanup(tmp_path, backend))


@pytest.mark.parametrize("name", MALFORMED)
def test_driver_refuses_malformed_ids_in_the_log(tmp_path: Path, name: str) -> None:
    root, _ = killed_session(tmp_path, "local")
    try:
        bad = MALFORMED[name]

        def edit(doc: dict[str, object]) -> None:
            doc["last_checkpoint"] = bad
            for c in doc["calls"].values():  # type: ignore[union-attr]
                c["before"] = bad

        plant(tmp_path, edit)
        store, workspace = sorted(os.listdir(tmp_path / "store")), tree(root)
        outside = sorted(os.listdir(tmp_path))
        p = run_driver(tmp_path, 2)
        assert p.returncode == 78, p.stderr[-2000:]
        assert "malformed checkpoint id" in p.stderr and "Traceback" not in p.stderr
        assert len(p.stderr) < 2000  # a 10 KB id is not echoed back whole
        assert sorted(os.listdir(tmp_path / "store")) == store
        assert sorted(os.listdir(tmp_path)) == outside and tree(root) == workspace
    finally:
        asyncio.run(cleanup(tmp_path, "local"))
        shutil.rmtree(tmp_path / "spaces", ignore_errors=True)
