"""Conformance: confined file operations and the workspace scan, per backend."""

from __future__ import annotations

import asyncio
import hashlib
import posixpath
import uuid
from collections.abc import Awaitable, Callable

import pytest

from durable_spaces.errors import PathEscapeError
from durable_spaces.space import ExecResult, PathEntry, Space

EPOCH = 1  # as in conftest.py
Sh = Callable[..., Awaitable[ExecResult]]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_reading_what_is_not_a_file_says_what_in_one_line(space: Space, sh: Sh) -> None:
    """``read_file("")`` raised ``IsADirectoryError`` with no message, and a directory's
    ``[Errno 21] Is a directory: 7`` named a descriptor: each now says what it read."""
    await space.write_file("d/f", b"x", epoch=EPOCH)
    with pytest.raises(IsADirectoryError) as empty:
        await space.read_file("")
    assert empty.value.strerror == "the path is empty: name a file in the workspace"
    for path in ("d", ".", space.root):
        with pytest.raises(IsADirectoryError) as err:
            await space.read_file(path)
        assert err.value.strerror == f"{path!r} is a directory, not a file", str(err.value)
    assert (await sh("mkfifo p")).exit_code == 0
    with pytest.raises(IsADirectoryError, match="'p' is not a regular file"):
        await space.read_file("p")


async def test_file_round_trip(space: Space) -> None:
    await space.write_file("d/e/f.txt", b"hello", mode=0o600, epoch=EPOCH)
    assert await space.read_file("d/e/f.txt") == b"hello"
    st = await space.stat("d/e/f.txt")
    assert st is not None and (st.kind, st.mode, st.size) == ("file", 0o600, 5)
    assert (await space.stat("d")).kind == "dir"  # type: ignore[union-attr]
    assert await space.list_dir("d/e") == ["f.txt"]
    await space.write_file(f"{space.root}/d/e/f.txt", b"again", epoch=EPOCH)  # absolute, inside
    assert await space.read_file("d/e/f.txt") == b"again"
    await space.remove("d/e/f.txt", epoch=EPOCH)
    assert await space.stat("d/e/f.txt") is None
    await space.remove("d/e/f.txt", epoch=EPOCH)  # missing is not an error
    await space.write_file("d/e/g", b"x", epoch=EPOCH)
    await space.remove("d", recursive=True, epoch=EPOCH)
    assert await space.stat("d") is None


@pytest.fixture
async def outside(space: Space, sh: Sh) -> str:
    """A directory beside the workspace (outside it) holding ``secret``."""
    path = posixpath.join(
        posixpath.dirname(space.root.rstrip("/")), f"outside-{uuid.uuid4().hex[:8]}"
    )
    r = await sh(f"mkdir -p '{path}' && printf secret > '{path}/secret'")
    assert r.exit_code == 0, r.output
    return path


async def _untouched(sh: Sh, outside: str) -> None:
    r = await sh(f"ls -A '{outside}'; cat '{outside}/secret'")
    assert r.output == b"secret\nsecret", "something outside the workspace was touched"


async def test_lexical_escapes_refused(space: Space, sh: Sh, outside: str) -> None:
    rel = posixpath.relpath(outside, space.root)  # ../outside-xxxx
    for path in (f"{rel}/secret", f"{outside}/secret", "a/../../x", "/etc/passwd"):
        with pytest.raises(PathEscapeError):
            await space.read_file(path)
        with pytest.raises(PathEscapeError):
            await space.write_file(path, b"pwned", epoch=EPOCH)
        with pytest.raises(PathEscapeError):
            await space.remove(path, epoch=EPOCH)
        with pytest.raises(PathEscapeError):
            await space.stat(path)
        with pytest.raises(PathEscapeError):
            await space.symlink(path, "target", epoch=EPOCH)
    with pytest.raises(PathEscapeError):
        await space.write_file(f"{rel}/new", b"pwned", epoch=EPOCH)
    with pytest.raises(PathEscapeError):
        await space.list_dir(rel)
    with pytest.raises(PathEscapeError):
        await space.scan(rel)
    await _untouched(sh, outside)


async def test_symlinks_pointing_outside_are_not_followed(
    space: Space, sh: Sh, outside: str
) -> None:
    await space.symlink("ldir", outside, epoch=EPOCH)
    await space.symlink("lfile", f"{outside}/secret", epoch=EPOCH)
    with pytest.raises(PathEscapeError):
        await space.read_file("ldir/secret")
    with pytest.raises(PathEscapeError):
        await space.read_file("lfile")
    with pytest.raises(PathEscapeError):
        await space.write_file("ldir/new", b"pwned", epoch=EPOCH)
    with pytest.raises(PathEscapeError):
        await space.write_file("ldir/sub/new", b"pwned", epoch=EPOCH)
    with pytest.raises(PathEscapeError):
        await space.remove("ldir/secret", epoch=EPOCH)
    with pytest.raises(PathEscapeError):
        await space.list_dir("ldir")
    with pytest.raises(PathEscapeError):
        await space.symlink("ldir/l2", "x", epoch=EPOCH)
    st = await space.stat("ldir")  # lstat: the link itself is fine to look at
    assert st is not None and st.kind == "symlink" and st.target == outside
    await _untouched(sh, outside)
    # Writing at a symlink's path never writes through it: it replaces it, or refuses.
    try:
        await space.write_file("lfile", b"pwned", epoch=EPOCH)
    except PathEscapeError:
        pass
    else:
        st = await space.stat("lfile")
        assert st is not None and st.kind == "file"
        assert await space.read_file("lfile") == b"pwned"
    await space.remove("ldir", epoch=EPOCH)  # removes the link, not its target
    assert await space.stat("ldir") is None
    await _untouched(sh, outside)


async def test_scan_sees_every_change(space: Space, sh: Sh) -> None:
    await space.write_file("a.txt", b"AAAA", epoch=EPOCH)
    await space.write_file("bin/run.sh", b"#!/bin/sh\n", mode=0o755, epoch=EPOCH)
    await space.write_file("gone.txt", b"bye", epoch=EPOCH)
    await space.write_file("skip/x", b"excluded", epoch=EPOCH)
    await space.symlink("l", "a.txt", epoch=EPOCH)
    table = await space.scan(exclude=["skip"])
    assert table == {
        "a.txt": PathEntry("file", 0o644, 4, _sha(b"AAAA")),
        "bin/run.sh": PathEntry("file", 0o755, 10, _sha(b"#!/bin/sh\n")),
        "gone.txt": PathEntry("file", 0o644, 3, _sha(b"bye")),
        "l": PathEntry("symlink", 0o777, target="a.txt"),
    }
    # Changes right after the scan: same size in place, mode only, link target,
    # deletion, a new file.
    r = await sh("printf BBBB > a.txt && chmod 700 bin/run.sh && rm gone.txt && printf n > new")
    assert r.exit_code == 0
    await space.symlink("l", "bin/run.sh", epoch=EPOCH)
    table = await space.scan(exclude=["skip"])
    assert table == {
        "a.txt": PathEntry("file", 0o644, 4, _sha(b"BBBB")),
        "bin/run.sh": PathEntry("file", 0o700, 10, _sha(b"#!/bin/sh\n")),
        "l": PathEntry("symlink", 0o777, target="bin/run.sh"),
        "new": PathEntry("file", 0o644, 1, _sha(b"n")),
    }
    assert set(await space.scan("bin")) == {"bin/run.sh"}
    assert "skip/x" in await space.scan()


@pytest.mark.parametrize("bad", ["back\\slash", "new\nline", "dir\\x/f"])
async def test_scan_reports_unrepresentable_names(space: Space, sh: Sh, bad: str) -> None:
    """Never raises (a command that made such a name must not wedge every later scan):
    the name comes back as one ``unsupported`` entry where the image stops, and a
    recursive remove takes it away."""
    await space.write_file("ok", b"ok", epoch=EPOCH)
    r = await space.exec(
        ["sh", "-c", 'mkdir -p "$(dirname "$1")" && touch "$1"', "sh", bad], key=None, epoch=EPOCH
    )
    assert r.exit_code == 0, r.output
    top = bad.split("/")[0]
    table = await space.scan()
    assert set(table) == {"ok", top}
    assert table[top].kind == "unsupported" and table[top].target
    assert set(await space.scan(exclude=[top])) == {"ok"}
    await space.remove(top, recursive=True, epoch=EPOCH)
    assert set(await space.scan()) == {"ok"}


async def test_scan_of_a_tree_deeper_than_it_descends(space: Space, sh: Sh) -> None:
    """A tree a command made deeper than ``MAX_SCAN_DEPTH`` is one ``unsupported`` entry at
    that depth (no recursion error, no fd exhaustion), and can be removed."""
    from durable_spaces.space import MAX_SCAN_DEPTH

    deep = "/".join(["d"] * (MAX_SCAN_DEPTH + 40))
    r = await sh(f"mkdir -p '{deep}' && echo x > '{deep}/f' && echo y > 'ok'")
    assert r.exit_code == 0, r.output
    table = await space.scan()
    cut = "/".join(["d"] * MAX_SCAN_DEPTH)
    assert set(table) == {"ok", cut}, sorted(table)[:3]
    assert table[cut].kind == "unsupported"
    await space.remove("d", recursive=True, epoch=EPOCH)
    assert set(await space.scan()) == {"ok"}


async def test_scan_rehashes_only_changed_files(space: Space) -> None:
    stats = getattr(space, "scan_stats", None)
    if stats is None:
        pytest.skip(f"{type(space).__name__} exposes no scan_stats counter")
    for i in range(20):
        await space.write_file(f"f/{i}.txt", b"%04d" % i, epoch=EPOCH)
    await asyncio.sleep(0.2)  # out of the racily-clean window
    h0 = stats["hashed"]
    assert len(await space.scan()) == 20
    assert stats["hashed"] - h0 == 20
    await space.scan()
    assert stats["hashed"] - h0 == 20, "unchanged files were hashed again"
    for i in (3, 7, 11):
        await space.write_file(f"f/{i}.txt", b"new!", epoch=EPOCH)
    await asyncio.sleep(0.2)
    table = await space.scan()
    assert stats["hashed"] - h0 == 23
    assert table["f/7.txt"].sha256 == _sha(b"new!")
    await space.scan()
    assert stats["hashed"] - h0 == 23


async def test_stale_file_mutations_are_refused_and_change_nothing(space: Space) -> None:
    """Every mutation carries the caller's epoch: below the floor it is refused whole."""
    from durable_spaces.errors import StaleEpochError

    await space.write_file("keep.txt", b"kept", epoch=EPOCH)
    await space.write_file("d/gone-not.txt", b"stays", epoch=EPOCH)
    await space.advance_epoch(EPOCH + 2)
    before = await space.scan(".")
    stale = EPOCH + 1
    with pytest.raises(StaleEpochError):
        await space.write_file("keep.txt", b"stale", epoch=stale)
    with pytest.raises(StaleEpochError):
        await space.write_file("new/stale.txt", b"stale", epoch=stale)
    with pytest.raises(StaleEpochError):
        await space.symlink("stale-link", "keep.txt", epoch=stale)
    with pytest.raises(StaleEpochError):
        await space.remove("keep.txt", epoch=stale)
    with pytest.raises(StaleEpochError):
        await space.remove("d", recursive=True, epoch=stale)
    assert await space.scan(".") == before
    assert await space.stat("new") is None, "a stale write created a parent directory"
    assert await space.read_file("keep.txt") == b"kept"
    # The current epoch still works.
    await space.write_file("keep.txt", b"current", epoch=EPOCH + 2)
    assert await space.read_file("keep.txt") == b"current"


async def test_writes_leave_no_temporary_in_the_workspace(space: Space) -> None:
    """Temporaries live beside the workspace: a crash between create and rename can never
    leave a stray file in it (the transactional image would adopt it)."""
    for i in range(5):
        await space.write_file(f"w/{i}.txt", b"x" * (i * 1000), epoch=EPOCH)
        await space.symlink(f"w/l{i}", f"{i}.txt", epoch=EPOCH)
    await space.write_file("w/0.txt", b"replaced", epoch=EPOCH)
    names = await space.list_dir("w")
    assert names == sorted([*(f"{i}.txt" for i in range(5)), *(f"l{i}" for i in range(5))])
    assert sorted(await space.list_dir(".")) == ["w"]


async def test_read_files_reads_many_in_one_go_and_leaves_out_what_it_cannot(
    space: Space, sh: Sh, outside: str
) -> None:
    """``read_files``: every regular file asked for, byte for byte as of the last scan
    or later; missing paths, directories and anything behind or at a symlink are left
    out (``read_file`` refuses them too); a path escaping the workspace is refused as
    ``read_file`` refuses it."""
    data = {f"r/{i}.bin": bytes(range(256)) * (i + 1) for i in range(6)}
    data["top.txt"] = b"top"
    data["sp ace/n\xc3\xa9.txt"] = b"unicode"
    for p, d in data.items():
        await space.write_file(p, d, epoch=EPOCH)
    await space.symlink("l", "top.txt", epoch=EPOCH)
    await space.symlink("ldir", outside, epoch=EPOCH)
    await space.scan()
    before = dict(data)
    r = await sh("printf changed > r/0.bin && printf fresh > new.txt")
    assert r.exit_code == 0, r.output
    data["r/0.bin"], data["new.txt"] = b"changed", b"fresh"
    got = await space.read_files([*data, "missing", "r", "l", "ldir/secret", "ldir"])
    assert set(got) == set(data), sorted(got)
    for p, d in got.items():
        assert d in (data[p], before.get(p)), p
    assert got["r/1.bin"] == data["r/1.bin"] and got["new.txt"] == b"fresh"
    assert await space.read_files([]) == {}
    with pytest.raises(PathEscapeError):
        await space.read_files(["top.txt", "../etc/passwd"])
