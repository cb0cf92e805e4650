"""``inode_pool``: files made ahead for a checkpoint batch. A batch that takes them must
write exactly what one making its files by name writes (the same bytes, names, modes,
no temporaries left); a killed process must leave nothing of its pool behind; a forked
child must never take its parent's files; where a pooled file cannot be linked (another
mount) the batch must still write every file, by name."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.adapter.checkpoints.inode_pool import InodePool
from durable_spaces.adapter.checkpoints.store import DirectoryCheckpointStore


def _supported(d: Path) -> None:
    try:
        os.close(os.open(d, os.O_RDWR | os.O_TMPFILE, 0o600))
    except OSError as e:
        pytest.skip(f"the filesystem of {d} makes no O_TMPFILE files: {e.strerror}")


def _wait_ready(pool: InodePool, dev: int, n: int) -> None:
    deadline = time.monotonic() + 10
    while pool.ready(dev) < n and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pool.ready(dev) >= n, "the pool was never topped up"


def _write(store: DirectoryCheckpointStore, tag: str, n: int) -> tuple[dict[str, bytes], int]:
    blobs = {}
    with store.batch() as b:
        for i in range(n):
            data = f"{tag}-{i}\n".encode() * 50
            blobs[b.add(data)] = data
        manifest = f"manifest {tag}".encode()
        b.manifest(CheckpointId.for_manifest(f"call-{tag}", manifest), manifest)
        pooled = b._pooled
    return blobs, pooled


def test_a_batch_writes_files_made_ahead_exactly_as_named_ones(tmp_path: Path) -> None:
    _supported(tmp_path)
    pool = InodePool()
    store = DirectoryCheckpointStore(tmp_path / "store", pool=pool)
    first, pooled = _write(store, "a", 6)
    assert pooled == 0  # nothing made ahead yet
    dev = os.stat(tmp_path / "store").st_dev
    _wait_ready(pool, dev, 7)
    second, pooled = _write(store, "b", 6)
    assert pooled == 7  # the six blobs and the manifest
    for sha, data in {**first, **second}.items():
        path = tmp_path / "store" / "blobs" / sha
        assert path.read_bytes() == data and hashlib.sha256(data).hexdigest() == sha
        st = path.stat()
        assert (st.st_mode & 0o777, st.st_nlink) == (0o600, 1)
        assert store.get_blob(sha) == data
    names = sorted(p.name for p in (tmp_path / "store").iterdir())
    assert not [n for n in names if n.startswith(".tmp-")], names
    assert len([n for n in names if n.endswith(".manifest")]) == 2


def test_a_killed_process_leaves_nothing_of_its_pool(tmp_path: Path) -> None:
    _supported(tmp_path)
    script = textwrap.dedent(
        """
        import os, sys, time
        from durable_spaces.adapter.checkpoints.ids import CheckpointId
        from durable_spaces.adapter.checkpoints.store import DirectoryCheckpointStore
        from durable_spaces.adapter.checkpoints.inode_pool import POOL
        store = DirectoryCheckpointStore(sys.argv[1])
        with store.batch() as b:
            for i in range(20):
                b.add(b"x%d" % i)
        dev = os.stat(sys.argv[1]).st_dev
        while POOL.ready(dev) < 20:
            time.sleep(0.005)
        print(POOL.ready(dev), flush=True)
        time.sleep(60)
        """
    )
    d = tmp_path / "store"
    p = subprocess.Popen([sys.executable, "-c", script, str(d)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and int(p.stdout.readline()) >= 20
        before = sorted(os.listdir(d))
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert sorted(os.listdir(d)) == before  # its files had no names
    assert not [n for n in before if n.startswith(".tmp-")]
    assert len(os.listdir(d / "blobs")) == 20


def test_a_forked_child_takes_none_of_its_parents_files(tmp_path: Path) -> None:
    _supported(tmp_path)
    pool = InodePool()
    store = DirectoryCheckpointStore(tmp_path / "store", pool=pool)
    _write(store, "a", 4)
    dev = os.stat(tmp_path / "store").st_dev
    _wait_ready(pool, dev, 4)
    dfd = os.open(tmp_path / "store", os.O_RDONLY | os.O_DIRECTORY)
    try:
        pid = os.fork()
        if pid == 0:  # the child: its copies of the descriptors are the parent's files
            os._exit(0 if pool.take(dfd) is None and pool.ready(dev) == 0 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert pool.ready(dev) >= 4  # the parent's are still its own
    finally:
        os.close(dfd)


def test_one_filler_thread_serves_every_top_up(tmp_path: Path) -> None:
    """Batch after batch, the pool is topped up by one thread per process (woken, never
    started again), and each batch after the first takes files made ahead."""
    _supported(tmp_path)
    pool = InodePool()
    store = DirectoryCheckpointStore(tmp_path / "store", pool=pool)
    dev = os.stat(tmp_path).st_dev
    before = {t.ident for t in threading.enumerate()}
    _write(store, "first", 4)
    fillers = set()
    for n in range(5):
        _wait_ready(pool, dev, 5)
        fillers |= {t.ident for t in threading.enumerate() if t.name == "ds-inode-pool"} - before
        _, pooled = _write(store, f"b{n}", 4)
        assert pooled == 5  # four blobs and the manifest, all made ahead
    assert len(fillers) == 1
    assert pool._filler is not None and pool._filler.is_alive() and pool._filler.daemon


_OTHER_MOUNT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from durable_spaces.adapter.checkpoints.ids import CheckpointId
    from durable_spaces.adapter.checkpoints.store import DirectoryCheckpointStore
    from durable_spaces.adapter.checkpoints.inode_pool import InodePool
    here, there, bound = sys.argv[1:4]
    subprocess.run(["mount", "--bind", there, bound], check=True)
    pool = InodePool()
    dev = os.stat(here).st_dev
    assert os.stat(bound).st_dev == dev  # the same filesystem, another mount
    pool.top_up(here, dev, 8)
    while pool.ready(dev) < 8:
        time.sleep(0.005)
    store = DirectoryCheckpointStore(bound, pool=pool)
    with store.batch() as b:
        shas = {b.add(b"blob %d" % i): b"blob %d" % i for i in range(3)}
        b.manifest(CheckpointId.for_manifest("call-x", b"m"), b"m")
        pooled = b._pooled
    assert pooled == 1, pooled  # taken once, refused by the link (EXDEV): off there
    for sha, data in shas.items():
        assert store.get_blob(sha) == data
    assert pool.ready(dev) == 0 and dev in pool._off  # not tried again there
    assert not [n for n in os.listdir(bound) if n.startswith(".tmp-")]
    print("ok")
    """
)


def test_where_a_pooled_file_cannot_be_linked_the_batch_writes_it_by_name(
    tmp_path: Path,
) -> None:
    _supported(tmp_path)
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and unshare(1) for a bind mount in a private mount namespace")
    here, there, bound = tmp_path / "here", tmp_path / "there", tmp_path / "bound"
    for d in (here, there, bound):
        d.mkdir()
    r = subprocess.run(
        [unshare, "-m", "--propagation", "private", sys.executable, "-c", _OTHER_MOUNT,
         str(here), str(there), str(bound)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if r.returncode != 0 and "mount" in r.stderr and "permission" in r.stderr.lower():
        pytest.skip(f"no bind mounts here: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
    assert len(os.listdir(there / "blobs")) == 3  # written through the other mount


def test_under_a_low_descriptor_limit_the_caches_stay_small(tmp_path: Path) -> None:
    """The pool and the kernel threads' directories each take a small share of the
    process's descriptor limit: a checkpointing process under ``ulimit -n 64`` still
    writes its batches and looks at its holders."""
    _supported(tmp_path)
    script = textwrap.dedent(
        """
        import os, resource, sys, time
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        from durable_spaces.host import holders as host_holders
        from durable_spaces.adapter.checkpoints.store import DirectoryCheckpointStore
        from durable_spaces.adapter.checkpoints.inode_pool import POOL
        kernel = host_holders._KERNEL
        assert POOL.total == 4 and kernel.limit == 8, (POOL.total, kernel.limit)
        store = DirectoryCheckpointStore(sys.argv[1])
        holders = host_holders.Holders(os.stat(sys.argv[1]).st_dev)
        for n in range(10):
            with store.batch() as b:
                for i in range(20):
                    b.add(b"%d-%d" % (n, i))
            assert holders.now() is not None
            time.sleep(0.02)
        assert len(os.listdir("/proc/self/fd")) < 40, os.listdir("/proc/self/fd")
        print("ok")
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "store")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
    assert len(os.listdir(tmp_path / "store" / "blobs")) == 200
