"""Checkpoints of a host workspace kept by its change journal
(``adapter/checkpoints/kept_tree.py``): after every kind of change a command can make,
the checkpoint the journal answered must be the one a fresh taker (no memory, no
journal: it walks and reads everything) takes of the same tree, and the journal, not a
walk, must have answered it. A store through a shared mapping raises no event and need
not move the file's mtime: a process that maps a file, stores, and outlives its call
must still be seen (the files some process holds are read again, ``host.holders``). And
the comparison can fail: the mutant ``journal_miss`` makes the journal lose a rewrite,
caught here."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from needs import need

from durable_spaces.adapter.checkpoints import incremental
from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints import store as checkpoint_store
from durable_spaces.adapter.checkpoints.incremental import Taker
from durable_spaces.adapter.checkpoints.store import DirectoryCheckpointStore
from durable_spaces.adapter.image import blob_id
from durable_spaces.backends import open_backend
from durable_spaces.backends.local import journal as jr
from durable_spaces.chaos import mutants
from durable_spaces.errors import SpaceError
from durable_spaces.host.holders import Holders
from durable_spaces.settings import Settings
from durable_spaces.space import Space, space_name

pytestmark = pytest.mark.skipif(
    not Settings.from_env().space_journal, reason="DS_SPACE_JOURNAL=0 turns journals off"
)

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("spacesd", marks=pytest.mark.spacesd, id="spacesd"),
]

#: Changes a command can make (run in the workspace), each followed by a checkpoint.
STEPS: list[tuple[str, str]] = [
    ("append", "printf more >> a.txt"),
    ("same-size rewrite in the same tick", "printf ALPHA > a.txt; printf alpha > a.txt"),
    (
        "rewrite with the old mtime",
        't=$(stat -c %y d/b.txt); printf BETA > d/b.txt; touch -d "$t" d/b.txt',
    ),
    ("chmod file", "chmod 600 d/b.txt"),
    ("chmod root", "chmod 711 ."),
    ("chmod dir", "chmod 700 d/e"),
    ("new file", "printf new > d/e/new.txt"),
    ("new tree", "mkdir -p t/u/v && printf deep > t/u/v/w.txt && printf x > t/x"),
    ("rename a file", "mv d/e/new.txt d/renamed.txt"),
    ("rename a tree", "mv t t2"),
    ("write inside the renamed tree", "printf deeper >> t2/u/v/w.txt"),
    ("remove a tree", "rm -r t2"),
    ("symlink", "ln -s a.txt link"),
    ("retarget symlink", "ln -sfn d/b.txt link"),
    ("hard link", "ln a.txt hard"),
    ("write through the hard link", "printf via-link >> hard"),
    ("unlink one name", "rm hard"),
    ("file becomes dir", "rm d/renamed.txt && mkdir d/renamed.txt && printf in > d/renamed.txt/f"),
    ("a dir made again, the same paths", "rm -r d/e && mkdir d/e && printf gamma > d/e/c.txt"),
    ("dir becomes symlink", "rm -r d/e && ln -s .. d/e"),
    ("fifo (left out)", "mkfifo pipe"),
    ("utime a dir", "touch -d '2001-01-01' d"),
    ("truncate", "truncate -s 0 a.txt"),
    ("rename over a file", "printf over > tmp && mv tmp d/b.txt"),
    ("many files", "mkdir m && for i in $(seq 1 60); do printf $i > m/$i; done"),
    ("remove all", "find . -mindepth 1 -delete"),
    ("back again", "printf again > a.txt && mkdir -p d && printf b > d/b.txt"),
]


def _need(backend: str) -> None:
    need(backend)


@asynccontextmanager
async def _space(tmp: Path, backend: str) -> AsyncIterator[Space]:
    _need(backend)
    b = open_backend(backend, tmp / "spaces")
    try:
        space = await b.create(space_name(f"journal-{tmp.name}"))
        await space.advance_epoch(1)
        await space.write_file("a.txt", b"alpha", epoch=1)
        await space.write_file("d/b.txt", b"beta", epoch=1)
        await space.write_file("d/e/c.txt", b"gamma", epoch=1)
        yield space
    finally:
        for name in await b.names():
            await b.delete(name)
        await b.close()


async def _sh(space: Space, script: str) -> None:
    res = await space.exec(["sh", "-c", script], key=None, epoch=1, cwd=space.root)
    assert res.exit_code == 0, res.output


async def _manifest(taker: Taker, space: Space, call_id: str) -> mf.Manifest:
    cid = await taker.checkpoint(space, call_id, 1)
    assert taker.store is not None
    data = taker.store.get(cid)
    assert data is not None
    m = mf.decode(data)
    assert mf.encode(m) == data  # the memos' bytes are the canonical ones
    return m


async def _checked(tmp: Path, taker: Taker, space: Space, call_id: str) -> mf.Manifest:
    """``taker``'s checkpoint, which must be the one a fresh taker takes."""
    got = await _manifest(taker, space, call_id)
    assert got == await _fresh(tmp, space, call_id), call_id
    return got


async def _fresh(tmp: Path, space: Space, call_id: str) -> mf.Manifest:
    """What a taker with no memory and no journal finds (it walks and reads it all)."""
    other = Taker(DirectoryCheckpointStore(tmp / f"fresh-{call_id}"))
    other._start_kept = lambda *a: None  # type: ignore[method-assign]
    m = await _manifest(other, space, call_id)
    assert other.stats == {"full": 1, "journal": 0}
    return m


@pytest.mark.parametrize("backend", BACKENDS)
async def test_every_change_a_command_makes_is_in_the_journaled_checkpoint(
    tmp_path: Path, backend: str
) -> None:
    async with _space(tmp_path, backend) as space:
        taker = Taker(DirectoryCheckpointStore(tmp_path / "store"))
        await _manifest(taker, space, "c0")
        assert taker.stats == {"full": 1, "journal": 0}, taker.why_full
        for i, (what, script) in enumerate(STEPS, 1):
            await _sh(space, script)
            got = await _manifest(taker, space, f"c{i}")
            assert got == await _fresh(tmp_path, space, f"c{i}"), what
            assert taker.stats == {"full": 1, "journal": i}, (what, taker.why_full)


#: Maps ``path``, stores ``first``, says so, then stores ``second`` when told to
#: (stdin), says so, and keeps the mapping and the file open until killed.
_MMAP_WRITER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, 0)
os.close(fd)
m[:5] = b"FIRST"
print("stored", flush=True)
sys.stdin.readline()
m[:5] = b"AGAIN"
print("stored", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize(
    ("look", "journal"),
    [(True, True), (True, False), (False, True)],
    ids=["journal", "walk", "no-holders-mutant"],
)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_stores_through_a_mapping_of_a_process_that_outlives_its_call_are_seen(
    tmp_path: Path, backend: str, look: bool, journal: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the journal or with a full walk (whose stat key need not move either).
    Without the look at who holds the files (``look`` False: a mutant whose look finds
    nobody) both stores are lost, which proves the look is what sees them."""
    if not look:
        monkeypatch.setattr(Holders, "now", lambda self: set())
    if not journal:
        monkeypatch.setenv("DS_SPACE_JOURNAL", "0")
    async with _space(tmp_path, backend) as space:
        await space.write_file("mapped.bin", b"x" * 8192, epoch=1)
        taker = Taker(DirectoryCheckpointStore(tmp_path / "store"))
        await _manifest(taker, space, "c0")
        path = os.path.join(space.root, "mapped.bin")
        writer = subprocess.Popen(
            [sys.executable, "-c", _MMAP_WRITER, path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert writer.stdin is not None and writer.stdout is not None
        try:
            assert writer.stdout.readline() == "stored\n"
            first = await _manifest(taker, space, "c1")
            # Same page, still dirty: no event, and the mtime need not move again.
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline() == "stored\n"
            time.sleep(0.06)  # past the racy window: the stat key alone would vouch
            second = await _manifest(taker, space, "c2")
            assert taker.stats["journal"] == (2 if journal else 0), taker.why_full
            data = Path(path).read_bytes()
            assert data.startswith(b"AGAIN")
            assert (first["mapped.bin"].ref == blob_id(b"FIRST" + b"x" * 8187)) is look
            assert (second["mapped.bin"].ref == blob_id(data)) is look
        finally:
            writer.kill()
            writer.wait()


def test_a_journal_that_misses_a_rewrite_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above can fail: with ``journal_miss`` (events of a file's
    contents dropped) a rewrite is lost from the journaled checkpoint."""

    async def run() -> tuple[mf.Manifest, mf.Manifest]:
        async with _space(tmp_path, "local") as space:
            taker = Taker(DirectoryCheckpointStore(tmp_path / "store"))
            await _manifest(taker, space, "c0")
            await _sh(space, "printf ALPHA > a.txt")
            await _manifest(taker, space, "c1")
            await _sh(space, "printf OMEGA > a.txt")
            monkeypatch.setattr(mutants, "_active", frozenset({"journal_miss"}))
            got = await _manifest(taker, space, "c2")
            monkeypatch.setattr(mutants, "_active", frozenset())
            return got, await _fresh(tmp_path, space, "c2")

    got, fresh = asyncio.run(run())
    assert got["a.txt"].ref != fresh["a.txt"].ref


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_checkpoint_that_fails_after_taking_the_events_leaves_no_listing_without_them(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal hands each event out once: a checkpoint that fails after that (here
    its store, at the first blob) must not leave a listing that lacks them, or the next
    checkpoint would keep the old contents. The next one walks everything instead."""
    async with _space(tmp_path, backend) as space:
        taker = Taker(DirectoryCheckpointStore(tmp_path / "store"))
        await _manifest(taker, space, "c0")
        await _sh(space, "printf changed > a.txt")

        def broken(self: object, *a: object, **kw: object) -> object:
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as m:
            m.setattr(checkpoint_store.Batch, "add", broken)
            with pytest.raises(SpaceError):
                await taker.checkpoint(space, "c1", 1)
        assert taker.stats == {"full": 1, "journal": 0}  # it failed inside the journal's
        got = await _manifest(taker, space, "c1")
        assert taker.stats == {"full": 2, "journal": 0}
        assert got == await _fresh(tmp_path, space, "c1")
        await _sh(space, "printf again > a.txt")
        got = await _manifest(taker, space, "c2")
        assert taker.stats == {"full": 2, "journal": 1}, taker.why_full
        assert got == await _fresh(tmp_path, space, "c2")


async def test_a_journal_that_breaks_while_it_walks_is_not_started_again_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More watches than a journal may hold: the walk is a full one every time (and
    right), and a new journal, which would add every watch again before it broke, is
    tried only after ``JOURNAL_PAUSE`` full walks."""
    monkeypatch.setattr(jr, "MAX_WATCHES", 3)
    async with _space(tmp_path, "local") as space:
        started = 0
        real = type(space).workspace_journal  # type: ignore[attr-defined]

        def counted(self: object) -> object:
            nonlocal started
            started += 1
            return real(self)

        monkeypatch.setattr(type(space), "workspace_journal", counted)
        taker = Taker(DirectoryCheckpointStore(tmp_path / "store"))
        for i in range(incremental.JOURNAL_PAUSE + 2):
            await _sh(space, f"printf {i} >> a.txt")
            await _checked(tmp_path, taker, space, f"c{i}")
        assert "more than 3 watches" in taker.why_full
        assert taker.stats == {"full": incremental.JOURNAL_PAUSE + 2, "journal": 0}
        assert started == 2  # the first walk's, then one after the pause


async def test_when_most_of_the_tree_changed_one_walk_replaces_the_looks(tmp_path: Path) -> None:
    async with _space(tmp_path, "local") as space:
        await _sh(space, "mkdir many && for i in $(seq 1 300); do printf $i > many/$i; done")
        taker = Taker(DirectoryCheckpointStore(tmp_path / "store"))
        await _manifest(taker, space, "c0")
        await _sh(space, "for i in $(seq 1 300); do printf x >> many/$i; done")
        await _checked(tmp_path, taker, space, "c1")
        assert taker.stats == {"full": 2, "journal": 0}
        assert taker.why_full == "most of the workspace changed"
        await _sh(space, "printf y >> many/7")
        await _checked(tmp_path, taker, space, "c2")
        assert taker.stats == {"full": 2, "journal": 1}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_checkpoints_taken_while_a_process_keeps_changing_the_tree_converge(
    tmp_path: Path, backend: str
) -> None:
    """Changes racing the looks (a writer that appends, renames, makes and removes
    trees while checkpoints are taken) land in one checkpoint or the next, never in
    neither: once the writer stops, the next checkpoint is the fresh one."""
    async with _space(tmp_path, backend) as space:
        taker = Taker(DirectoryCheckpointStore(tmp_path / "store"))
        await _manifest(taker, space, "c0")
        script = (
            "i=0; while [ $i -lt 400 ]; do i=$((i+1)); printf $i >> a.txt; "
            "mkdir -p t/$((i % 7)) && printf $i > t/$((i % 7))/f; "
            "[ $((i % 5)) = 0 ] && rm -rf t/$((i % 3)); "
            "[ $((i % 11)) = 0 ] && mv d d2 && mv d2 d; "
            "printf $i > d/b.txt; done"
        )
        writer = subprocess.Popen(["sh", "-c", script], cwd=space.root)
        try:
            n = 0
            while writer.poll() is None:
                n += 1
                with contextlib.suppress(SpaceError):  # "kept changing under" is allowed
                    await taker.checkpoint(space, f"r{n}", 1)
        finally:
            writer.kill()
            writer.wait()
        assert n >= 2
        await _checked(tmp_path, taker, space, "end")
        assert taker.stats["journal"] >= 1, taker.why_full


async def test_a_file_gone_while_a_new_tree_is_walked_does_not_lose_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file removed between its watch and its lstat, inside a directory the journal
    named: that is the tree changing under the walk (a retry), not the directory gone.
    Dropping the directory would drop its watches too, and every later change under it."""
    async with _space(tmp_path, "local") as space:
        taker = Taker(DirectoryCheckpointStore(tmp_path / "store"))
        await _manifest(taker, space, "c0")
        await _sh(space, "mkdir n && printf 1 > n/f1 && printf 2 > n/f2 && printf 3 > n/f3")
        real = jr.ChangeJournal.file
        removed: list[str] = []

        def file(self: jr.ChangeJournal, rel: str, dir_fd: int, name: str) -> None:
            real(self, rel, dir_fd, name)
            if rel == "n/f2" and not removed:
                removed.append(rel)
                os.unlink(name, dir_fd=dir_fd)  # a concurrent `rm n/f2`

        with monkeypatch.context() as m:
            m.setattr(jr.ChangeJournal, "file", file)
            got = await _manifest(taker, space, "c1")
        assert removed and got == await _fresh(tmp_path, space, "c1")
        await _sh(space, "printf more >> n/f3")
        await _checked(tmp_path, taker, space, "c2")
        assert taker.stats["journal"] >= 1, taker.why_full


async def test_two_spaces_checkpointed_at_once_through_one_taker_keep_their_own_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each Space is locked on its own, so one taker may checkpoint two at once, in two
    threads. Each workspace's manifest memos are its own: the same paths with other
    contents in the other Space never get into this one's manifest."""
    async with _space(tmp_path / "a", "local") as a, _space(tmp_path / "b", "local") as b:
        await _sh(b, "printf BBB > a.txt")
        taker = Taker(DirectoryCheckpointStore(tmp_path / "store"))
        for space, cid in ((a, "a0"), (b, "b0"), (a, "a1")):
            await _manifest(taker, space, cid)
        await _sh(a, "printf '!' >> a.txt")
        real = mf.Encoder.encode
        mine = blob_id(b"alpha!")

        def slow(self: mf.Encoder, m: mf.Manifest, changed: object = None) -> bytes:
            out = real(self, m, changed)  # type: ignore[arg-type]
            if m["a.txt"].ref == mine:
                time.sleep(0.3)  # a's thread paused after its encode: b's runs meanwhile
            return out

        async def b_meanwhile() -> object:
            await asyncio.sleep(0.1)
            return await taker.checkpoint(b, "b2", 1)

        with monkeypatch.context() as m:
            m.setattr(mf.Encoder, "encode", slow)
            await asyncio.gather(taker.checkpoint(a, "a2", 1), b_meanwhile())
        await _sh(a, "printf '?' >> d/b.txt")
        got = await _checked(tmp_path, taker, a, "a3")
        assert got["a.txt"].ref == mine


async def test_a_taker_lets_go_of_spaces_it_used_longest_ago(tmp_path: Path) -> None:
    """A deleted Space sends no word to the taker, and each Space it remembers holds
    inotify instances (a user has 128): past ``MAX_SEEN`` the oldest is let go."""

    def instances() -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds if _link(f"/proc/self/fd/{fd}") == "anon_inode:inotify")

    before = instances()
    taker = Taker(DirectoryCheckpointStore(tmp_path / "store"))
    for i in range(incremental.MAX_SEEN + 6):
        async with _space(tmp_path / f"s{i}", "local") as space:
            await _manifest(taker, space, f"c{i}")
            assert taker.stats["full"] == i + 1
    assert len(taker.seen) == incremental.MAX_SEEN
    assert instances() - before <= 2 * incremental.MAX_SEEN  # a journal and a copy watch
    for seen in list(taker.seen.values()):
        seen.close()
    assert instances() == before


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


async def test_a_taker_with_the_journal_off_walks_every_time(tmp_path: Path) -> None:
    """``Settings.space_journal`` off (``DS_SPACE_JOURNAL=0``) is the taker's own: it
    walks the whole tree at every checkpoint, even of a Space whose backend keeps a
    journal (the settings are read once, where the taker is made, never under it)."""
    async with _space(tmp_path, "local") as space:
        on = Taker(DirectoryCheckpointStore(tmp_path / "store"))
        await _manifest(on, space, "c0")
        await _checked(tmp_path, on, space, "c1")
        assert on.stats == {"full": 1, "journal": 1}
        off = Taker(
            DirectoryCheckpointStore(tmp_path / "store"), settings=Settings(space_journal=False)
        )
        await _manifest(off, space, "c2")
        await _checked(tmp_path, off, space, "c3")
        assert off.stats == {"full": 2, "journal": 0}
