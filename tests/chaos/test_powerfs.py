"""powerfs against the real kernel FUSE, real SQLite and real shell tools.

Each test mounts a fresh backing dir, changes things through the mountpoint, cuts the
power and looks at what came back. The two ``POWERFS_MUTANTS`` tests run a check against
a layer broken on purpose and require the check to fail.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import random
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_spaces.chaos.powerfs import PowerFS, PowerFSError, mount
from durable_spaces.errors import ConfigError

pytestmark = pytest.mark.fuse  # skipped without FUSE, failed on CI (tests/needs.py)


class Mnt:
    """A mounted powerfs: ``root`` is the mountpoint, ``backing`` the durable image."""

    def __init__(self, base: Path, **options: object) -> None:
        self.base = base
        self.backing = base / "backing"
        self.root = base / "mnt"
        self.backing.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(exist_ok=True)
        self.options = options
        self.fs: PowerFS = mount(self.backing, self.root, state_dir=base / "state", **options)  # type: ignore[arg-type]

    def close(self) -> None:
        with contextlib.suppress(PowerFSError):
            self.fs.unmount(sync=False)


@pytest.fixture
def mnt(tmp_path: Path) -> Iterator[Mnt]:
    m = Mnt(tmp_path)
    yield m
    m.close()


def write(path: Path, data: bytes, *, sync: str = "") -> None:
    """Write a whole file; ``sync`` is "", "fsync" or "fdatasync"."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            getattr(os, sync)(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_file(m: Mnt, name: str, data: bytes) -> Path:
    """A file whose data and name are durable."""
    p = m.root / name
    write(p, data, sync="fsync")
    fsync_path(p.parent)
    return p


# --- file data ---------------------------------------------------------------------


def test_data_is_volatile_until_fsync(mnt: Mnt) -> None:
    p = durable_file(mnt, "a", b"old")
    write(p, b"new")
    assert p.read_bytes() == b"new"  # a process sees its own writes
    assert (mnt.backing / "a").read_bytes() == b"old"
    fsync_path(p)
    assert (mnt.backing / "a").read_bytes() == b"new"


def test_a_cut_drops_unsynced_data(mnt: Mnt) -> None:
    p = durable_file(mnt, "a", b"durable")
    write(p, b"volatile and longer")
    st = mnt.fs.stats()
    assert st.pending_bytes == len(b"volatile and longer") and st.pending_ops >= 2
    report = mnt.fs.cut()
    assert report.ops == st.pending_ops and report.bytes == st.pending_bytes
    assert p.read_bytes() == b"durable"
    after = mnt.fs.stats()
    assert (after.boot, after.cuts, after.pending_ops) == (1, 1, 0)
    assert after.dropped == (report,)


def test_fdatasync_keeps_data_but_not_mode(mnt: Mnt) -> None:
    p = durable_file(mnt, "a", b"one")
    os.chmod(p, 0o600)
    write(p, b"two", sync="fdatasync")
    mnt.fs.cut()
    assert p.read_bytes() == b"two"
    assert stat.S_IMODE(p.stat().st_mode) == 0o644  # chmod is metadata: fsync only
    os.chmod(p, 0o600)
    fsync_path(p)
    mnt.fs.cut()
    assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_sync_and_xattrs_are_not_durability_calls(mnt: Mnt) -> None:
    p = durable_file(mnt, "a", b"old")
    write(p, b"new")
    fd = os.open(p, os.O_RDONLY)  # syncfs(2) of the mount: not forwarded to a FUSE server
    assert ctypes.CDLL(None, use_errno=True).syncfs(fd) == 0
    os.close(fd)
    assert mnt.fs.stats().pending_bytes == 3
    with pytest.raises(OSError) as e:
        os.setxattr(p, "user.k", b"v")
    assert e.value.errno == errno.EOPNOTSUPP
    mnt.fs.cut()
    assert p.read_bytes() == b"old"


def test_o_dsync_writes_are_durable(mnt: Mnt) -> None:
    p = durable_file(mnt, "a", b"")
    fd = os.open(p, os.O_WRONLY | os.O_DSYNC)
    os.write(fd, b"synced by the flag")
    mnt.fs.cut()
    os.close(fd)
    assert p.read_bytes() == b"synced by the flag"


def test_truncate_is_volatile_and_regrows_with_zeros(mnt: Mnt) -> None:
    p = durable_file(mnt, "a", b"x" * 1000)
    os.truncate(p, 10)
    mnt.fs.cut()
    assert p.read_bytes() == b"x" * 1000
    os.truncate(p, 10)
    os.truncate(p, 100)
    fsync_path(p)
    mnt.fs.cut()
    assert p.read_bytes() == b"x" * 10 + b"\0" * 90


def test_shared_mmap_and_msync(mnt: Mnt) -> None:
    import mmap

    p = durable_file(mnt, "m", b"\0" * 4096)
    with open(p, "r+b") as f1, open(p, "r+b") as f2:
        m1, m2 = mmap.mmap(f1.fileno(), 4096), mmap.mmap(f2.fileno(), 4096)
        m1[:5] = b"hello"
        assert m2[:5] == b"hello"  # one page cache: both maps see it (SQLite's -shm)
        m1.flush()  # msync(MS_SYNC): the kernel writes the page back and fsyncs
        m1.close()
        m2.close()
    mnt.fs.cut()
    assert p.read_bytes()[:5] == b"hello"


# --- torn writes -------------------------------------------------------------------


def _torn(base: Path, seed: int, offset: int, length: int) -> tuple[int, bytes, bytes]:
    m = Mnt(base, seed=seed, tear=True)
    try:
        data = bytes(random.Random(7).randrange(256) for _ in range(length))
        p = durable_file(m, "f", b"s" * offset)
        fd = os.open(p, os.O_WRONLY)
        os.pwrite(fd, b"dropped", 0)  # an earlier unsynced write: dropped whole
        os.pwrite(fd, data, offset)  # the last one: torn
        os.close(fd)
        report = m.fs.cut()
        (tear,) = report.torn
        assert (tear.path, tear.offset, tear.length) == ("f", offset, length)
        return tear.kept, data, p.read_bytes()
    finally:
        m.close()


def test_torn_write_lands_at_the_seeded_sector_boundary(tmp_path: Path) -> None:
    from durable_spaces.chaos.powerfs.cut import boundary

    kept, data, got = _torn(tmp_path / "one", seed=11, offset=0, length=5000)
    assert 0 + kept == boundary(11, 1, "f", 0, 5000)
    assert kept % 512 == 0 and kept < 5000
    assert got == data[:kept]
    again, _, got2 = _torn(tmp_path / "two", seed=11, offset=0, length=5000)
    assert (again, got2) == (kept, got)  # same seed, same boundary
    kept3, data3, got3 = _torn(tmp_path / "three", seed=12, offset=1000, length=3000)
    assert 1000 + kept3 == boundary(12, 1, "f", 1000, 3000) and kept3 < 3000
    assert kept3 == 0 or (1000 + kept3) % 512 == 0
    assert got3 == b"s" * 1000 + data3[:kept3]
    seen = {boundary(s, 1, "f", 0, 5000) for s in range(40)}
    assert seen <= set(range(0, 5000, 512)) and len(seen) > 3  # the seed does choose


# --- directory entries -------------------------------------------------------------


def test_rename_without_dir_fsync_comes_back_under_the_old_name(mnt: Mnt) -> None:
    durable_file(mnt, "old", b"content")
    os.rename(mnt.root / "old", mnt.root / "new")
    assert sorted(os.listdir(mnt.root)) == ["new"]
    mnt.fs.cut()
    assert sorted(os.listdir(mnt.root)) == ["old"]
    assert (mnt.root / "old").read_bytes() == b"content"
    os.replace(mnt.root / "old", mnt.root / "new")
    fsync_path(mnt.root)
    mnt.fs.cut()
    assert sorted(os.listdir(mnt.root)) == ["new"]


def test_replace_over_an_existing_file_with_dir_fsync(mnt: Mnt) -> None:
    durable_file(mnt, "config", b"v1")
    write(mnt.root / "config.tmp", b"v2", sync="fsync")
    os.replace(mnt.root / "config.tmp", mnt.root / "config")
    mnt.fs.cut()
    assert sorted(os.listdir(mnt.root)) == ["config"]  # the tmp name was never durable
    assert (mnt.root / "config").read_bytes() == b"v1"
    write(mnt.root / "config.tmp", b"v2", sync="fsync")
    os.replace(mnt.root / "config.tmp", mnt.root / "config")
    fsync_path(mnt.root)
    mnt.fs.cut()
    assert (mnt.root / "config").read_bytes() == b"v2"
    assert sorted(os.listdir(mnt.root)) == ["config"]


def test_cross_directory_rename_is_durable_per_directory(mnt: Mnt) -> None:
    (mnt.root / "src").mkdir()
    (mnt.root / "dst").mkdir()
    fsync_path(mnt.root)
    durable_file(mnt, "src/f", b"data")
    os.rename(mnt.root / "src/f", mnt.root / "dst/f")
    fsync_path(mnt.root / "dst")  # the target only: the source still names it too
    mnt.fs.cut()
    assert (mnt.root / "src/f").read_bytes() == (mnt.root / "dst/f").read_bytes() == b"data"
    assert (mnt.root / "src/f").stat().st_nlink == 2
    os.rename(mnt.root / "dst/f", mnt.root / "src/g")
    fsync_path(mnt.root / "dst")  # the source only: no durable name is left for it
    mnt.fs.cut()
    assert os.listdir(mnt.root / "dst") == []
    assert os.listdir(mnt.root / "src") == ["f"]  # src/g was never made durable
    (mnt.root / "src" / "d").mkdir()
    fsync_path(mnt.root / "src")
    os.rename(mnt.root / "src" / "d", mnt.root / "dst" / "d")
    fsync_path(mnt.root / "dst")  # a directory has one durable name: the move is whole
    mnt.fs.cut()
    assert (os.listdir(mnt.root / "src"), os.listdir(mnt.root / "dst")) == (["f"], ["d"])


def test_unlink_is_undone_without_dir_fsync(mnt: Mnt) -> None:
    durable_file(mnt, "a", b"keep me")
    os.unlink(mnt.root / "a")
    mnt.fs.cut()
    assert (mnt.root / "a").read_bytes() == b"keep me"
    os.unlink(mnt.root / "a")
    fsync_path(mnt.root)
    mnt.fs.cut()
    assert not (mnt.root / "a").exists()


def test_create_needs_the_dir_fsync(mnt: Mnt) -> None:
    write(mnt.root / "a", b"data", sync="fsync")  # strict POSIX: the name is not durable
    mnt.fs.cut()
    assert os.listdir(mnt.root) == []
    write(mnt.root / "b", b"data")  # named durably, data never synced: comes back empty
    fsync_path(mnt.root)
    write(mnt.root / "c", b"late data", sync="fsync")  # data first, name later
    fsync_path(mnt.root)
    mnt.fs.cut()
    assert (mnt.root / "b").read_bytes() == b""
    assert (mnt.root / "c").read_bytes() == b"late data"


def test_mkdir_symlink_and_link_need_the_parent_fsync(mnt: Mnt) -> None:
    (mnt.root / "d").mkdir()
    (mnt.root / "d" / "e").mkdir()
    fsync_path(mnt.root / "d")  # d's entries, but d itself is not named durably
    os.symlink("d/e", mnt.root / "s")
    mnt.fs.cut()
    assert os.listdir(mnt.root) == []
    (mnt.root / "d").mkdir()
    (mnt.root / "d" / "e").mkdir()
    os.symlink("d/e", mnt.root / "s")
    durable_file(mnt, "f", b"x")
    os.link(mnt.root / "f", mnt.root / "d" / "hard")
    fsync_path(mnt.root)
    fsync_path(mnt.root / "d")
    mnt.fs.cut()
    assert sorted(os.listdir(mnt.root)) == ["d", "f", "s"]
    assert os.readlink(mnt.root / "s") == "d/e" and (mnt.root / "s").is_dir()
    assert (mnt.root / "d" / "hard").stat().st_ino == (mnt.root / "f").stat().st_ino
    (mnt.root / "d" / "e").rmdir()
    mnt.fs.cut()
    assert (mnt.root / "d" / "e").is_dir()


def test_moving_nested_directories_around_each_other(mnt: Mnt) -> None:
    (mnt.root / "a" / "b").mkdir(parents=True)
    fsync_path(mnt.root)
    fsync_path(mnt.root / "a")
    os.rename(mnt.root / "a" / "b", mnt.root / "b")
    os.rename(mnt.root / "a", mnt.root / "b" / "a")
    fsync_path(mnt.root / "b")  # b is still inside a in the image: a tree sync
    assert mnt.fs.stats().tree_syncs == 1
    mnt.fs.cut()
    assert os.listdir(mnt.root) == ["b"] and os.listdir(mnt.root / "b") == ["a"]


def test_reserved_name_and_bad_mounts(mnt: Mnt, tmp_path: Path) -> None:
    with pytest.raises(PermissionError):
        (mnt.root / ".powerfs").mkdir()
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    with pytest.raises(ConfigError, match="not empty"):
        mount(mnt.backing, full)
    with pytest.raises(ConfigError, match="not a directory"):
        mount(tmp_path / "missing", tmp_path / "full")
    with pytest.raises(ConfigError, match="already a mount point"):
        mount(tmp_path / "full", mnt.root)


# --- processes across a cut ----------------------------------------------------------


def test_open_files_fail_fast_at_a_cut_and_locks_are_local(mnt: Mnt) -> None:
    durable_file(mnt, "lock", b"")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(mnt.root / 'lock')!r}, os.O_RDWR)\n"
            "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "while True:\n"
            "    try:\n"
            "        os.pwrite(fd, b'x', 0)\n"
            "    except OSError as e:\n"
            "        print(e.errno, flush=True); sys.exit(0)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        import fcntl

        fd = os.open(mnt.root / "lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        mnt.fs.cut()  # returns though a process holds a lock on the mount (the event)
        assert int(holder.stdout.readline()) in (errno.ENOTCONN, errno.ECONNABORTED)
        assert holder.wait(10) == 0
        with pytest.raises(OSError) as e:
            os.pwrite(fd, b"y", 0)
        assert e.value.errno == errno.ENOTCONN
        os.close(fd)
        fd = os.open(mnt.root / "lock", os.O_RDWR)  # the new mount: no lock survives
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    finally:
        holder.kill()
        holder.wait()


# --- real workloads ----------------------------------------------------------------

_SCRIPT = r"""
set -euo pipefail
mkdir -p src/sub
for i in $(seq 1 20); do echo "line $i" > src/sub/f$i.txt; done
chmod 0755 src/sub/f1.txt
ln -s sub/f1.txt src/link
ln src/sub/f2.txt src/hard
tar czf ws.tgz src
mkdir out && tar xzf ws.tgz -C out
(cd src && sha256sum sub/*.txt) > sums
(cd out/src && sha256sum --quiet -c ../../sums)
mv src/sub/f3.txt src/moved.txt
cp -a src/sub/f4.txt src/copied.txt
sed -i 's/line/LINE/' src/sub/f5.txt
test "$(cat src/link)" = "line 1"
find . -name '*.txt' | wc -l
"""


def _tree(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            elif rel != "ws.tgz":  # gzip stamps the time
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_nlink, p.read_bytes())
    return out


def test_shell_workspace_and_clean_unmount(tmp_path: Path) -> None:
    m = Mnt(tmp_path)
    try:
        run = subprocess.run(["bash", "-c", _SCRIPT], cwd=m.root, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split()[-1] == "41"
        m.fs.cut()  # nothing was fsynced: the workspace is the empty durable image
        assert os.listdir(m.root) == []
        run = subprocess.run(["bash", "-c", _SCRIPT], cwd=m.root, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        before = _tree(m.root)
        m.fs.unmount(sync=True)  # a clean unmount flushes everything
        assert _tree(m.backing) == before
        m = Mnt(tmp_path)
        assert _tree(m.root) == before
        m.fs.cut()
        assert _tree(m.root) == before
    finally:
        m.close()


_SQLITE_WRITER = """
import sys
from durable_spaces.harness.log import SqliteStorage
s = SqliteStorage(sys.argv[1], synchronous=sys.argv[2])
n = len(s.load())
for i in range(n + 1, n + 1 + int(sys.argv[3])):
    assert s.append([{"n": i}]) == i
    print(i, flush=True)
"""

_JSONL_WRITER = """
import sys, warnings
from durable_spaces.harness.log import JsonlStorage
warnings.simplefilter("ignore")
s = JsonlStorage(sys.argv[1])
n = len(s.load())
for i in range(n + 1, n + 1 + int(sys.argv[2])):
    assert s.append([{"n": i, "pad": "p" * (i % 700)}]) == i
    print(i, flush=True)
"""


HANG_S = 300.0  # a wait for an event this long is a hang, not a pace


def _cut_while_writing(m: Mnt, argv: list[str], rng: random.Random) -> list[int]:
    """Run a writer, cut the power at a random moment, return the seqs it acknowledged."""
    proc = subprocess.Popen(
        [sys.executable, "-c", *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    acked: list[int] = []
    # The cut comes after a drawn number of acknowledged commits, not after a drawn time:
    # on a loaded machine a time let too few commits through (the test asserts a few
    # hundred went through its cuts). HANG_S only turns a writer that stopped into a failure.
    want = rng.randint(40, 120)
    enough = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            acked.append(int(line))
            if len(acked) >= want:
                enough.set()
        enough.set()  # the writer ended (or died) first

    reader = threading.Thread(target=read)
    reader.start()
    assert enough.wait(HANG_S), f"the writer acknowledged {len(acked)} of {want} commits"
    m.fs.cut()
    proc.kill()
    proc.wait()
    reader.join()
    return acked


def _sqlite_survivors(path: Path) -> tuple[str, list[int]]:
    import sqlite3

    from durable_spaces.harness.log import SqliteStorage

    con = sqlite3.connect(path)
    check = con.execute("PRAGMA integrity_check").fetchone()[0]
    con.close()
    s = SqliteStorage(path)
    try:
        return check, [c.ops[0]["n"] for c in s.load()]
    finally:
        s.close()


@pytest.mark.slow
@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_sqlite_wal_across_cuts(tmp_path: Path, synchronous: str) -> None:
    m = Mnt(tmp_path, seed=5, tear=True)
    rng = random.Random(f"sqlite-{synchronous}")
    db = m.root / "log.sqlite"
    total, lost = 0, 0
    try:
        for _ in range(6):
            acked = _cut_while_writing(m, [_SQLITE_WRITER, str(db), synchronous, "400"], rng)
            check, got = _sqlite_survivors(db)
            assert check == "ok"
            assert got == list(range(1, len(got) + 1))  # a prefix: nothing torn or skipped
            if synchronous == "FULL":
                assert not acked or acked[-1] <= len(got), (acked[-1], len(got))
            lost += max(0, (acked[-1] if acked else 0) - len(got))
            total += len(acked)
        assert total >= 200, total  # a few hundred commits went through the cuts
        torn = [t for c in m.fs.stats().dropped for t in c.torn]
        assert torn, "no write was torn: the test would not see a torn WAL frame"
        print(f"{synchronous}: {total} commits, {lost} lost to cuts, {len(torn)} torn writes")
    finally:
        m.close()


def _jsonl_lost(m: Mnt, rng: random.Random, rounds: int) -> list[str]:
    """Run JSONL writers across cuts; the problems found (empty: the log kept its word)."""
    import warnings

    from durable_spaces.harness.log import JsonlStorage

    problems = []
    log = m.root / "log.jsonl"
    for r in range(rounds):
        acked = _cut_while_writing(m, [_JSONL_WRITER, str(log), "300"], rng)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = JsonlStorage(log)
            got = [c.ops[0]["n"] for c in s.load()]
            s.close()
        if got != list(range(1, len(got) + 1)):
            problems.append(f"round {r}: not a prefix")
        if acked and acked[-1] > len(got):
            problems.append(f"round {r}: acknowledged {acked[-1]} lines, {len(got)} survived")
    return problems


def test_jsonl_keeps_every_fsynced_line(tmp_path: Path) -> None:
    m = Mnt(tmp_path, seed=3, tear=True)
    try:
        assert _jsonl_lost(m, random.Random("jsonl"), rounds=3) == []
    finally:
        m.close()


# --- the checks catch a broken layer -------------------------------------------------


def test_mutant_fsync_noop_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERFS_MUTANTS", "fsync_noop")
    m = Mnt(tmp_path)
    try:
        assert _jsonl_lost(m, random.Random("jsonl"), rounds=1) != []
    finally:
        m.close()


def test_mutant_dirsync_noop_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERFS_MUTANTS", "dirsync_noop")
    m = Mnt(tmp_path)
    try:
        durable_file(m, "a", b"x")
        m.fs.cut()
        assert os.listdir(m.root) == []  # what test_create_needs_the_dir_fsync would catch
    finally:
        m.close()


def test_cli_round_trip(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "m").mkdir()
    py = [sys.executable, "-m", "durable_spaces.chaos.powerfs"]
    out = subprocess.run(
        [*py, "mount", str(tmp_path / "b"), str(tmp_path / "m"), "--seed", "4"],
        capture_output=True,
        text=True,
        check=True,
    )
    state = json.loads(out.stdout)["state_dir"]
    try:
        (tmp_path / "m" / "f").write_text("volatile")
        stats = json.loads(
            subprocess.run([*py, "stats", state], capture_output=True, text=True, check=True).stdout
        )
        assert stats["pending_ops"] >= 2
        cut = json.loads(
            subprocess.run([*py, "cut", state], capture_output=True, text=True, check=True).stdout
        )
        assert cut["cut"] == 1 and cut["ops"] == stats["pending_ops"]
        assert os.listdir(tmp_path / "m") == []
    finally:
        subprocess.run([*py, "unmount", state], check=True)
    assert not os.path.ismount(tmp_path / "m")
    assert not os.path.exists(state)  # the temp state dir mount() made is gone
    bad = subprocess.run(
        [*py, "mount", str(tmp_path / "nope"), str(tmp_path / "m")], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "not a directory" in bad.stderr


@pytest.mark.spacesd
async def test_spacesd_data_dir_on_powerfs(tmp_path: Path) -> None:
    from durable_spaces.backends.spacesd.backend import SpacesdBackend

    m = Mnt(tmp_path)
    backend = SpacesdBackend(m.root / "spaces")
    try:
        space = await backend.create("p")
        r = await space.exec(["bash", "-c", "echo x >> f; cat f"], key="k@1", epoch=1)
        assert (r.exit_code, r.output) == (0, b"x\n")
        assert m.fs.stats().writes > 0  # the daemon's data dir really is on the mount
        await backend.kill_daemon("p")
        m.fs.cut()  # the host loses power: the daemon comes back on the durable state
        again = await backend.create("p")
        r = await again.exec(["bash", "-c", "echo y >> f; cat f"], key="k@2", epoch=2)
        assert r.exit_code == 0 and r.output.endswith(b"y\n")
        await backend.delete("p")
    finally:
        await backend.close()
        m.close()
