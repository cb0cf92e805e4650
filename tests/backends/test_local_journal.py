"""The host change journal (``backends/local/journal.py``, ``journaled.py``): a scan the
journal answers must be the table a full scan finds, after every kind of change a
command can make; and whatever the journal cannot vouch for (overflow, too many watches,
a replaced workspace, a restarted machine, a new epoch) makes the next scan a full one.

Each step compares the journaled scanner with a fresh ``local_fs.Scanner`` (no cache,
no journal) on the same tree, and checks the journal, not a full walk, answered it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_spaces.backends.local import fs as local_fs
from durable_spaces.backends.local import journal as jr
from durable_spaces.backends.local.backend import LocalBackend
from durable_spaces.backends.local.journaled import JournaledScanner
from durable_spaces.chaos import mutants
from durable_spaces.settings import Settings

pytestmark = pytest.mark.skipif(
    not Settings.from_env().space_journal, reason="DS_SPACE_JOURNAL=0 turns journals off"
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "work"
    r.mkdir()
    (r / "a.txt").write_bytes(b"alpha")
    (r / "d").mkdir()
    (r / "d" / "b.txt").write_bytes(b"beta")
    (r / "d" / "e").mkdir()
    (r / "d" / "e" / "c.txt").write_bytes(b"gamma")
    (r / "skip").mkdir()
    (r / "skip" / "x").write_bytes(b"excluded")
    return r


def _scanner(
    root: Path, tmp_path: Path, guard: Callable[[], str | None] | None = None
) -> JournaledScanner:
    staging = str(tmp_path / "staging")
    return JournaledScanner(str(root), lambda r: jr.ChangeJournal(r, staging, guard))


def _full(root: Path) -> dict[str, object]:
    return dict(local_fs.Scanner().scan(str(root), ".", ["skip"]))


def _sh(root: Path, script: str) -> None:
    subprocess.run(["sh", "-c", script], cwd=root, check=True)


#: Changes a command can make, each followed by a journaled scan.
STEPS: list[tuple[str, str]] = [
    ("append", "printf more >> a.txt"),
    ("same size rewrite, mtime put back", "printf ALPHA > a.txt && touch -d @1000000000 a.txt"),
    ("chmod", "chmod 700 d/b.txt"),
    ("new file", "printf n > new.txt"),
    ("new tree", "mkdir -p t/u/v && printf deep > t/u/v/f && printf w > t/u/w"),
    ("write in the new tree", "printf again >> t/u/v/f"),
    ("rename a file over another", "mv new.txt d/b.txt"),
    ("rename a directory", "mv d/e moved"),
    ("write in the moved directory", "printf changed > moved/c.txt"),
    ("symlink replaces a directory", "mv t t2 && ln -s /etc t"),
    ("retarget a symlink", "ln -sfn a.txt t"),
    ("hard link outside, write through it", "ln a.txt ../outside && printf X >> ../outside"),
    ("write through an fd after the name went",
     "exec 3>>moved/c.txt && rm moved/c.txt && ln ../outside moved/c.txt && printf Y >&3"),
    ("remove a tree", "rm -r t2"),
    ("excluded change", "printf y > skip/x && mkdir skip/z && printf q > skip/z/q"),
    ("fifo is not in the image", "mkfifo fifo"),
    ("unsupported name", "printf b > 'back\\slash'"),
    ("empty the workspace", "rm -rf ./* ../outside"),
]  # fmt: skip


def test_a_journaled_scan_is_what_a_full_scan_finds(root: Path, tmp_path: Path) -> None:
    s = _scanner(root, tmp_path)
    assert s.scan(".", ["skip"]) == _full(root)
    assert s.stats["full"] == 1
    for what, script in STEPS:
        _sh(root, script)
        assert s.scan(".", ["skip"]) == _full(root), what
    assert s.stats["full"] == 1, s.why_full
    assert s.stats["journal"] == len(STEPS)
    s.close()


def test_small_answers_only_small_changes_and_loses_none(root: Path, tmp_path: Path) -> None:
    """``small`` (a spacesd Space's scan on its event loop) answers each step the way a
    full scan would, or declines; what it declined (consumed from the journal) is in the
    next ``scan``: nothing a command changed is lost between the two."""
    s = _scanner(root, tmp_path)
    assert s.small(".", ["skip"]) is None  # no journal yet: a full scan first
    s.scan(".", ["skip"])
    answered = 0
    for what, script in STEPS:
        _sh(root, script)
        table = s.small(".", ["skip"])
        if table is None:
            table = s.scan(".", ["skip"])
        else:
            answered += 1
        assert table == _full(root), what
    assert 0 < answered < len(STEPS)  # both ways were taken
    assert s.stats["full"] == 1, s.why_full
    _sh(root, "mkdir big && for i in $(seq 40); do printf $i > big/f$i; done")
    assert s.small(".", ["skip"]) is None  # a new tree: declined, its events kept
    _sh(root, "printf later > later.txt")
    assert s.scan(".", ["skip"]) == _full(root)
    assert s.stats["full"] == 1
    s.close()


MMAP = (
    "import mmap, os, sys\n"
    "fd = os.open('a.txt', os.O_RDWR)\n"
    "m = mmap.mmap(fd, 0)\n"
    "os.close(fd)\n"  # the mapping outlives the descriptor
    "m[0:1] = b'Z'\n"
    "m.close()\n"
)


def test_stores_through_a_shared_mapping_are_seen_once_the_writer_exits(
    root: Path, tmp_path: Path
) -> None:
    """No inotify event reports a store through ``mmap``; the last close of the file
    (the mapping holds it open) does, after every store of a command that exited."""
    s = _scanner(root, tmp_path)
    s.scan(".", ["skip"])
    subprocess.run([sys.executable, "-c", MMAP], cwd=root, check=True)
    assert (root / "a.txt").read_bytes() == b"Zlpha"
    assert s.scan(".", ["skip"]) == _full(root)
    assert s.stats["full"] == 1


def test_an_unchanged_workspace_costs_no_look(root: Path, tmp_path: Path) -> None:
    s = _scanner(root, tmp_path)
    s.scan(".", ["skip"])
    hashed, relooked = s.stats["hashed"], s.stats["relooked"]
    for _ in range(3):
        s.scan(".", ["skip"])
    assert (s.stats["hashed"], s.stats["relooked"]) == (hashed, relooked)
    assert s.stats["full"] == 1


def test_a_journal_that_misses_writes_is_seen_to_differ(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above can fail: the mutant ``journal_miss`` loses an append."""
    monkeypatch.setattr(mutants, "_active", frozenset({"journal_miss"}))
    s = _scanner(root, tmp_path)
    s.scan(".", ["skip"])
    _sh(root, "printf more >> a.txt")
    assert s.scan(".", ["skip"]) != _full(root)


def test_an_overflowed_queue_means_a_full_scan(root: Path, tmp_path: Path) -> None:
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    s = _scanner(root, tmp_path)
    s.scan(".", ["skip"])
    # Alternating between two watched files: inotify merges only identical neighbours.
    with (
        open(root / "a.txt", "ab", buffering=0) as f1,
        open(root / "d" / "b.txt", "ab", buffering=0) as f2,
    ):
        for _ in range(limit // 2 + 100):
            f1.write(b"1")
            f2.write(b"2")
    assert s.scan(".", ["skip"]) == _full(root)
    assert s.stats["full"] == 2 and "overflowed" in s.why_full
    _sh(root, "printf z >> a.txt")  # the new journal keeps the next scan
    assert s.scan(".", ["skip"]) == _full(root)
    assert s.stats["full"] == 2


def test_too_many_watches_means_full_scans(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jr, "MAX_WATCHES", 3)
    s = _scanner(root, tmp_path)
    for i in range(3):
        _sh(root, f"printf {i} >> a.txt")
        assert s.scan(".", ["skip"]) == _full(root)
    assert s.stats["full"] == 3 and s.stats["journal"] == 0
    assert "watches" in s.why_full


def test_a_replaced_workspace_means_a_full_scan(root: Path, tmp_path: Path) -> None:
    s = _scanner(root, tmp_path)
    s.scan(".", ["skip"])
    shutil.move(str(root), str(tmp_path / "old"))
    root.mkdir()
    (root / "other").write_bytes(b"o")
    assert s.scan(".", ["skip"]) == _full(root) == {"other": _full(root)["other"]}
    assert s.stats["full"] == 2


def test_a_guard_and_a_reset_mean_a_full_scan(root: Path, tmp_path: Path) -> None:
    why: list[str] = []
    s = _scanner(root, tmp_path, guard=lambda: why[0] if why else None)
    s.scan(".", ["skip"])
    why.append("the Space's machine restarted")
    _sh(root, "printf r >> a.txt")
    assert s.scan(".", ["skip"]) == _full(root)
    assert s.stats["full"] == 2 and s.why_full == "the Space's machine restarted"
    why.clear()
    s.reset("a new epoch")
    assert s.scan(".", ["skip"]) == _full(root)
    assert s.stats["full"] == 3


async def test_local_space_trusts_no_journal_across_a_restart_or_an_epoch(
    state_dir: Path,
) -> None:
    b = LocalBackend(state_dir)
    space = await b.create("jr")
    try:
        await space.write_file("f", b"1", epoch=1)
        await space.scan()
        await space.scan()
        stats = space.scan_stats
        assert (stats["full"], stats["journal"]) == (1, 1)
        # The same object, its machine restarted under it (the boot mark changed).
        await b.restart("jr")
        await space.write_file("f", b"22", epoch=1)
        assert (await space.scan())["f"].size == 2
        assert (stats["full"], stats["journal"]) == (2, 1)
        await space.scan()
        assert (stats["full"], stats["journal"]) == (2, 2)
        await space.advance_epoch(2)
        await space.write_file("f", b"333", epoch=2)
        assert (await space.scan())["f"].size == 3
        assert (stats["full"], stats["journal"]) == (3, 2)
    finally:
        await b.delete("jr")


def test_the_journal_refuses_a_workspace_with_a_mount_inside() -> None:
    info = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:5 / /w/sub rw - tmpfs tmpfs rw\n"
    assert jr.mount_problem(info, "/w") is not None and "mounted" in str(
        jr.mount_problem(info, "/w")
    )
    assert jr.mount_problem(info, "/x") is None
    nfs = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n41 22 0:6 / /n rw - nfs4 srv:/ rw\n"
    assert "not a local one" in str(jr.mount_problem(nfs, "/n/w"))
    assert jr.mount_problem("22 1 8:1 / /a\\040b rw - ext4 /dev/sda1 rw\n", "/a b/c") is None


async def test_read_files_answers_from_the_scans_bytes_without_a_thread(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files a scan just hashed are read back from what it kept, here, with no
    worker thread (``LocalSpace._kept_if_free``); one it did not keep (or a path changed
    since) goes the thread's way and is read from the disk."""
    import asyncio

    b = LocalBackend(state_dir)
    space = await b.create("rf")
    threads: list[object] = []
    real = asyncio.to_thread

    async def counted(fn: Callable[..., object], *a: object) -> object:
        threads.append(fn)
        return await real(fn, *a)

    try:
        await space.write_file("old", b"old", epoch=1)
        await space.scan()
        await space.write_file("a", b"alpha", epoch=1)
        await space.write_file("d/b", b"beta", epoch=1)
        await space.scan()  # the journal's: it reads and keeps the two new files
        monkeypatch.setattr(asyncio, "to_thread", counted)
        assert await space.read_files(["a", "d/b"]) == {"a": b"alpha", "d/b": b"beta"}
        assert threads == []
        assert await space.read_files(["a", "old", "gone"]) == {"a": b"alpha", "old": b"old"}
        assert len(threads) == 1
    finally:
        monkeypatch.undo()
        await b.delete("rf")
