"""Unit tests of the adapter's parts that need no Space: the image chain, the state
document's pruning, archive checks, the stream fence, epoch parsing, and the manifest
encoder's cache."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

from durable_spaces.adapter import image_log as img
from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.manifest_build import Builder, build
from durable_spaces.adapter.checkpoints.snapshots import check_archive
from durable_spaces.adapter.checkpoints.workspace_tree import TreeListing, TreeNode
from durable_spaces.adapter.durable import session_epoch
from durable_spaces.adapter.effects import Effect
from durable_spaces.adapter.space_state import KEEP_CALLS, CallRecord, SpaceState
from durable_spaces.adapter.tool_args import BashArgs
from durable_spaces.errors import ConfigError, PathEscapeError
from durable_spaces.harness.log import MemoryFence
from durable_spaces.space import PathEntry


def _file(n: int) -> PathEntry:
    return PathEntry("file", 0o644, n, f"{n:064x}")


def test_image_chain_reads_back_every_version_and_writes_deltas_not_tables() -> None:
    docs: dict[str, Any] = {}
    pointer = None
    table: dict[str, PathEntry] = {}
    versions = []
    for i in range(40):
        new = dict(table)
        new[f"f{i % 7}.txt"] = _file(i)
        if i % 5 == 4:
            new.pop(f"f{(i + 3) % 7}.txt", None)
        pointer, chain = img.next_image(pointer, table, new)
        docs.update(chain)
        versions.append((dict(pointer), new))
        table = new
        if pointer["v"] != pointer["full"]:
            ((name, value),) = chain.items()
            assert name.startswith("cua.space.image/delta/")
            assert len(value["put"]) <= 1  # a delta holds the change, not the table
    for p, want in versions:
        assert img.read_image(p, docs.get) == want
    fulls = [k for k in docs if "/full/" in k]
    assert len(fulls) == 40 // img.FULL_EVERY + 1


def test_image_chain_missing_link_is_an_error_not_a_smaller_image() -> None:
    p1, c1 = img.next_image(None, {}, {"a": _file(1)})
    p2, _c2 = img.next_image(p1, {"a": _file(1)}, {"a": _file(2)})
    with pytest.raises(KeyError, match="delta 2"):
        img.read_image(p2, {**c1}.get)


def test_state_keeps_only_recent_calls_but_counts_all() -> None:
    s = SpaceState()
    for i in range(KEEP_CALLS + 5):
        s.calls[f"c{i}"] = CallRecord(f"c{i}", "bash", s.next_order())
    back = SpaceState.from_json(s.to_json())
    assert list(back.calls) == [f"c{i}" for i in range(5, KEEP_CALLS + 5)]
    assert back.calls_total == KEEP_CALLS + 5 and back.has_history
    assert back.next_order() == KEEP_CALLS + 6


def _tar(members: list[tarfile.TarInfo]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for m in members:
            t.addfile(m, io.BytesIO(b"x" * m.size) if m.isfile() else None)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type = kind
    m.linkname = link
    m.size = 1 if kind == tarfile.REGTYPE else 0
    return m


@pytest.mark.parametrize(
    "members",
    [
        [_member("../evil")],
        [_member("/etc/evil")],
        [_member("link", tarfile.SYMTYPE, "/etc"), _member("link/passwd")],
        [_member("hard", tarfile.LNKTYPE, "../../etc/passwd")],
        [_member("dev", tarfile.CHRTYPE)],
    ],
    ids=["dotdot", "absolute", "under-symlink", "hardlink-out", "device"],
)
def test_restore_refuses_archives_that_escape(members: list[tarfile.TarInfo]) -> None:
    with pytest.raises(PathEscapeError):
        check_archive(_tar(members))


def _refusal(members: list[tarfile.TarInfo]) -> str | None:
    """Why ``check_archive`` refuses the archive of ``members``, or None if it takes it."""
    try:
        check_archive(_tar(members))
    except PathEscapeError as e:
        return str(e)
    return None


@pytest.mark.parametrize(
    "members",
    [
        [_member("./a.txt"), _member("./l", tarfile.SYMTYPE, "a.txt")],
        [_member("d", tarfile.DIRTYPE), _member("d/a"), _member("d/l", tarfile.SYMTYPE, "../d/a")],
        [_member("a"), _member("h", tarfile.LNKTYPE, "a")],  # a hard link to an earlier file
        [_member("out", tarfile.SYMTYPE, "/etc")],  # a link may point anywhere: nothing under it
        [_member(".", tarfile.DIRTYPE), _member("x/../y")],
    ],
    ids=["inner-symlink", "dir-and-link", "hardlink-in", "link-out-alone", "dot-and-normalised"],
)
def test_restore_accepts_ordinary_archives(members: list[tarfile.TarInfo]) -> None:
    # An over-strict check would lose a user's checkpoint: each of these must be taken.
    assert _refusal(members) is None


class _Ctx:
    def __init__(self) -> None:
        self.out: list[str] = []
        self.conversation_id = "c1"

    def output(self, chunk: str) -> None:
        self.out.append(chunk)


def test_stream_fence_stops_forwarding_once_a_newer_epoch_exists() -> None:
    fence = MemoryFence(1)
    fence.check()
    ctx = _Ctx()
    effect = Effect(BashArgs("true"), ctx, fence, None)  # type: ignore[arg-type]
    effect._forward(b"before\n")
    fence.writer(2).check()  # a newer driver commits
    effect._fence_checked = 0.0  # the 200 ms throttle has passed
    effect._forward(b"after\n")
    assert ctx.out == ["before\n"]


@pytest.mark.parametrize("raw", ["x", "0", "-3"])
def test_session_epoch_from_a_malformed_environment_is_a_clear_error(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUA_SESSION_EPOCH", raw)
    with pytest.raises(ConfigError, match="CUA_SESSION_EPOCH"):
        session_epoch(None)


def test_the_manifest_encoder_is_encode_byte_for_byte_as_a_workspace_changes() -> None:
    """A checkpoint's id is the digest of these bytes: the cached rows must never differ
    from ``encode``, whatever changed (content, mode, mtime, kind) or went."""
    m: mf.Manifest = {".": mf.ManifestEntry(mf.DIR, 0o755, 0, None, 1)}
    for i in range(50):
        m[f"d/f{i}"] = mf.ManifestEntry(mf.FILE, 0o644, i, f"{i:064x}", 10 + i)
    m["d"] = mf.ManifestEntry(mf.DIR, 0o755, 0, None, 2)
    m["\udcff-bad-byte é"] = mf.ManifestEntry(mf.SYMLINK, 0o777, 0, "d/f1", 3)
    m["d/hard"] = mf.ManifestEntry(mf.HARDLINK, 0, 0, "d/f0", 0)
    enc = mf.Encoder()
    steps = [
        lambda: None,
        lambda: m.__setitem__("d/f3", mf.ManifestEntry(mf.FILE, 0o644, 3, "e" * 64, 13)),
        lambda: m.__setitem__("d/f4", mf.ManifestEntry(mf.FILE, 0o600, 4, f"{4:064x}", 14)),
        lambda: m.__setitem__("d/f5", mf.ManifestEntry(mf.FILE, 0o644, 5, f"{5:064x}", 99)),
        lambda: m.__setitem__("d/f6", mf.ManifestEntry(mf.SYMLINK, 0o777, 0, "elsewhere", 16)),
        lambda: m.pop("d/f7"),
        lambda: m.__setitem__("d/new", mf.ManifestEntry(mf.FILE, 0o644, 1, "a" * 64, 1)),
    ]
    for step in steps:
        step()
        data = enc.encode(m)
        assert data == mf.encode(m)
        assert mf.decode(data) == m


def test_the_manifest_builder_is_build_entry_for_entry_as_a_workspace_changes() -> None:
    """What ``Builder`` kept (the order, each path's entry) never shows: every step's
    manifest equals a fresh ``build``, whether a file's node, its blob only, a link's
    target, a directory's mode, the hard links or the set of paths changed."""
    nodes: dict[str, TreeNode] = {
        ".": TreeNode(mf.DIR, 0o755, 0, 1, 2, 1, 1),
        "d": TreeNode(mf.DIR, 0o755),
    }
    shas: dict[str, str] = {}
    for i in range(30):
        nodes[f"d/f{i}"] = TreeNode(mf.FILE, 0o644, i, 100 + i, 1, 10 + i, 10 + i)
        shas[f"d/f{i}"] = f"{i:064x}"
    nodes["l"] = TreeNode(mf.SYMLINK, 0o777, 0, 7, 1, 5, 5, "d/f1")

    touched: set[str] = set()

    def put(path: str, node: TreeNode, sha: str | None = None) -> None:
        nodes[path] = node
        touched.add(path)
        if sha is not None:
            shas[path] = sha

    steps = [
        lambda: None,
        lambda: put("d/f3", nodes["d/f3"]._replace(size=33, ctime_ns=99), "e" * 64),
        lambda: put("d/f4", nodes["d/f4"], "f" * 64),  # same node, another blob
        lambda: put("d/f5", nodes["d/f5"]._replace(mode=0o600)),
        lambda: put("l", nodes["l"]._replace(target="elsewhere")),
        lambda: put("d", nodes["d"]._replace(mode=0o700)),
        lambda: (
            put("d/f6", nodes["d/f6"]._replace(nlink=2)),
            put("d/a-link", nodes["d/f6"]._replace(nlink=2), shas["d/f6"]),
        ),
        lambda: put("d/a-link", nodes["d/a-link"]._replace(ino=555, nlink=1)),
        lambda: (
            nodes.pop("d/f7"),
            put("d/f70", TreeNode(mf.FILE, 0o644, 1, 900, 1, 1, 1), "a" * 64),
        ),
    ]
    b, enc = Builder(), mf.Encoder()
    told, told_enc = Builder(), mf.Encoder()  # told which paths changed (a journal's)
    for step in steps:
        touched.clear()
        step()
        listing = TreeListing(0, dict(nodes))
        got = b.build(listing, shas.__getitem__)
        assert got == build(listing, shas.__getitem__)
        assert list(got) == list(build(listing, shas.__getitem__))  # the manifest's order
        assert enc.encode(got) == mf.encode(got)
        also = told.build(listing, shas.__getitem__, set(touched))
        assert also == got and list(also) == list(got)
        assert told_enc.encode(also, told.changed) == mf.encode(got)
