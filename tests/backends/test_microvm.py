"""Machine-level properties of microvm Spaces: whole-machine checkpoints, restores, forks.

Real QEMU guests running the real cua-spacesd (``make microvm-image``); skipped with the
reason when QEMU or the image is missing. Under TCG each machine is slow, so each test
keeps at most two guests running at once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from needs import need

from durable_spaces.backends.microvm.backend import MicrovmBackend
from durable_spaces.space import ExecState

pytestmark = [pytest.mark.microvm, pytest.mark.slow]

COUNTER = (
    "nohup bash -c 'i=0; while :; do i=$((i+1)); echo $i > count; sleep 0.2; done' "
    ">/dev/null 2>&1 & echo $!"
)


@pytest.fixture
async def backend(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[MicrovmBackend]:
    need("microvm")
    monkeypatch.setenv("CUA_HOME", str(tmp_path / "cua-home"))
    b = MicrovmBackend(state_dir)
    try:
        yield b
    finally:
        for name in await b.names():
            await b.delete(name)
        await b.prune(set())  # memory files are large: leave none behind
        await b.close()


def _name() -> str:
    return f"mv-{uuid.uuid4().hex[:8]}"


async def _count(space: Any) -> int:
    """The counter's value: ``echo $i > count`` truncates before it writes, so a read
    between the two sees nothing (once, on a loaded machine); read again then."""
    for _ in range(50):
        text = (await space.read_file("count")).decode()
        if text.endswith("\n"):
            return int(text)
        await asyncio.sleep(0.02)
    raise AssertionError(f"the counter file stays incomplete: {text!r}")


async def _wait_count(space: Any, above: int = 0, timeout: float = 30) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            n = await _count(space)
            if n > above:
                return n
        except (FileNotFoundError, ValueError):
            pass
        if loop.time() > deadline:
            raise AssertionError(f"the counter did not get past {above}")
        await asyncio.sleep(0.2)


async def test_restore_brings_back_the_process_and_drops_later_files(
    backend: MicrovmBackend,
) -> None:
    b = backend
    name = _name()
    sp = await b.create(name)
    caps = await sp.capabilities()
    assert caps.kind == "microvm" and caps.machine_checkpoints and caps.exec_ledger
    r = await sp.exec(["bash", "-c", COUNTER], key=f"{name}:c:0@1", epoch=1)
    assert r.exit_code == 0
    await _wait_count(sp, 2)
    cid = await b.checkpoint(name)
    at_ckpt = await _count(sp)
    await sp.write_file("after.txt", b"written after the checkpoint", epoch=1)
    await _wait_count(sp, at_ckpt + 5)

    sp = await b.restore(name, cid)
    await sp.advance_epoch(2)  # what the adapter does next; the counter (epoch 1) dies now
    assert await sp.stat("after.txt") is None
    rec = await sp.exec_record(f"{name}:c:0@1")
    assert rec.state == ExecState.EXITED and rec.exit_code == 0


async def test_restored_process_keeps_its_pid_and_counts_on(backend: MicrovmBackend) -> None:
    b = backend
    name = _name()
    sp = await b.create(name)
    # Started without the ledger: an epoch raise would not kill it, so it stays to be seen.
    r = await sp.exec(["bash", "-c", COUNTER], key=None, epoch=1)
    pid = int(r.output.split()[-1])
    await _wait_count(sp, 2)
    cid = await b.checkpoint(name)
    at_ckpt = await _count(sp)
    before_restore = await _wait_count(sp, at_ckpt + 5)

    sp = await b.restore(name, cid)
    first = await _count(sp)
    assert at_ckpt <= first < before_restore, (at_ckpt, first, before_restore)
    again = await _wait_count(sp, first)
    assert again > first
    alive = await sp.exec(
        ["sh", "-c", f"kill -0 {pid} && tr '\\0' ' ' < /proc/{pid}/cmdline"], key=None, epoch=1
    )
    assert alive.exit_code == 0 and b"while" in alive.output, alive


async def test_two_forks_run_at_once_and_diverge(backend: MicrovmBackend) -> None:
    b = backend
    src = _name()
    sp = await b.create(src)
    await sp.write_file("shared.txt", b"from the source", epoch=1)
    r = await sp.exec(["bash", "-c", COUNTER], key=None, epoch=1)
    pid = int(r.output.split()[-1])
    await _wait_count(sp, 1)
    cid = await b.checkpoint(src)
    await b.delete(src)  # forks do not need their source (only its checkpoint)
    fa, fb = _name(), _name()
    a = await b.fork(cid, fa)
    c = await b.fork(cid, fb)
    assert a.instance_id != c.instance_id
    assert b.qemu_pid(fa) and b.qemu_pid(fb)
    await a.write_file("mine.txt", b"a", epoch=1)
    await c.write_file("mine.txt", b"c", epoch=1)
    assert await a.read_file("mine.txt") == b"a"
    assert await c.read_file("mine.txt") == b"c"
    assert await a.read_file("shared.txt") == await c.read_file("shared.txt")
    na, nc = await _wait_count(a, 1), await _wait_count(c, 1)
    assert await _wait_count(a, na) > na and await _wait_count(c, nc) > nc
    for f in (a, c):  # the same process, running in each fork
        res = await f.exec(["sh", "-c", f"kill -0 {pid}"], key=None, epoch=1)
        assert res.exit_code == 0
    # Each fork has its own token: one fork's token does not open the other.
    assert a._token != c._token


async def test_find_after_a_driver_restart_and_restart_keeps_the_disk(
    backend: MicrovmBackend, state_dir: Path
) -> None:
    b = backend
    name = _name()
    sp = await b.create(name)
    await sp.write_file("kept.txt", b"kept", epoch=1)
    done = await sp.exec(["sh", "-c", "echo done"], key=f"{name}:d:0@1", epoch=1)
    assert done.exit_code == 0
    await sp.advance_epoch(3)
    running = await sp.spawn(["sleep", "600"], key=f"{name}:r:0@3", epoch=3)
    await running.detach()

    other = MicrovmBackend(state_dir)  # a new driver process would build this
    found = await other.find(name)
    assert found is not None and found.instance_id == sp.instance_id
    assert await found.read_file("kept.txt") == b"kept"

    await other.restart(name)
    sp2 = await other.find(name)
    assert sp2 is not None and sp2.instance_id == sp.instance_id
    assert await sp2.read_file("kept.txt") == b"kept"
    assert await sp2.current_epoch() == 3
    assert (await sp2.exec_record(f"{name}:d:0@1")).state == ExecState.EXITED
    assert (await sp2.exec_record(f"{name}:r:0@3")).state == ExecState.LOST
    await other.close()


async def test_prune_keeps_only_what_is_asked(backend: MicrovmBackend) -> None:
    b = backend
    name = _name()
    await b.create(name)
    c1 = await b.checkpoint(name)
    c2 = await b.checkpoint(name)
    assert set(await b.checkpoints()) == {c1, c2}
    assert await b.prune({c2}) == [c1]
    assert await b.checkpoints() == [c2]
    sp = await b.restore(name, c2)
    assert (await sp.capabilities()).machine_checkpoints


async def test_prune_space_spares_other_spaces_and_a_living_fork_source(
    backend: MicrovmBackend,
) -> None:
    b = backend
    a, f = _name(), _name()
    await b.create(a)
    a1 = await b.checkpoint(a)
    a2 = await b.checkpoint(a)
    await b.fork(a1, f)  # f's Space runs from a1: a1 must outlive a's pruning
    f1 = await b.checkpoint(f)
    assert await b.prune_space(a, {a2}) == []
    assert set(await b.checkpoints()) == {a1, a2, f1}
    await b.delete(f)
    assert await b.prune_space(a, {a2}) == [a1]
    assert set(await b.checkpoints()) == {a2, f1}  # f's own are not a's to prune
    # A prune killed between its rename and its delete leaves a trash directory: it is
    # never listed or restored, and the next prune removes it.
    d = b.state_dir / "checkpoints" / f1
    d.rename(d.with_name(f1 + ".del"))
    assert await b.checkpoints() == [a2]
    await b.prune_space(a, {a2})
    assert not d.with_name(f1 + ".del").exists()


async def test_kill_daemon_keeps_the_machine_and_orphans_are_swept_when_asked(
    backend: MicrovmBackend,
) -> None:
    b = backend
    name = _name()
    sp = await b.create(name)
    ex = await sp.spawn(["sleep", "600"], key=f"{name}:s:0@1", epoch=1)
    pid = ex.pid
    await ex.detach()
    qemu = b.qemu_pid(name)
    await b.kill_daemon(name)
    assert b.qemu_pid(name) == qemu  # the machine stayed up
    sp = await b.find(name)
    assert (await sp.exec_record(f"{name}:s:0@1")).state == ExecState.LOST
    # The command survived its daemon as an orphan of the guest's pid 1 ...
    alive = await sp.exec(["sh", "-c", "pgrep -x sleep"], key=None, epoch=1)
    assert alive.exit_code == 0, alive
    # By default an orphan is machine state (a server an agent left running): it stays.
    await sp.advance_epoch(2)
    kept = await sp.exec(["sh", "-c", "pgrep -x sleep"], key=None, epoch=2)
    assert kept.exit_code == 0, kept
    # With sweep_orphans, every process the new daemon does not own is swept.
    b.sweep_orphans = True
    try:
        await sp.advance_epoch(3)
    finally:
        b.sweep_orphans = False
    gone = await sp.exec(["sh", "-c", "pgrep -x sleep"], key=None, epoch=3)
    assert gone.exit_code == 1, (pid, gone)


_CHILD = """
import asyncio, sys
from durable_spaces.backends.microvm.backend import MicrovmBackend
b = MicrovmBackend(sys.argv[1])
op, name = sys.argv[2], sys.argv[3]
if op == "checkpoint":
    asyncio.run(b.checkpoint(name))
elif op == "create":
    asyncio.run(b.create(name))
elif op == "fork":
    asyncio.run(b.fork(sys.argv[4], name))
"""


def _killed_child(state_dir: Path, point: str, *args: str) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, DS_FAILPOINTS=f"{point}:1")
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, str(state_dir), *args], env=env, capture_output=True
    )
    assert p.returncode == -9, p.stderr.decode()[-2000:]


@pytest.mark.parametrize("point", ["microvm.checkpoint.stopped", "microvm.checkpoint.snapshot"])
async def test_driver_killed_inside_a_checkpoint_leaves_a_usable_space(
    backend: MicrovmBackend, state_dir: Path, point: str
) -> None:
    b = backend
    name = _name()
    sp = await b.create(name)
    await sp.write_file("before.txt", b"1", epoch=1)
    await asyncio.to_thread(_killed_child, state_dir, point, "checkpoint", name)
    sp = await b.find(name)  # continues the stopped guest
    await sp.write_file("after.txt", b"2", epoch=1)
    assert await sp.read_file("before.txt") == b"1"
    cid = await b.checkpoint(name)
    await sp.write_file("later.txt", b"3", epoch=1)
    await b.restart(name)  # cold boot of the recorded top
    sp = await b.find(name)
    assert await sp.read_file("later.txt") == b"3"
    sp = await b.restore(name, cid)
    assert await sp.read_file("after.txt") == b"2"
    assert await sp.stat("later.txt") is None


async def test_driver_killed_before_a_fork_got_its_token_is_finished_by_find(
    backend: MicrovmBackend, state_dir: Path
) -> None:
    b = backend
    src, dst = _name(), _name()
    sp = await b.create(src)
    await sp.write_file("x.txt", b"x", epoch=1)
    cid = await b.checkpoint(src)
    await b.delete(src)
    await asyncio.to_thread(_killed_child, state_dir, "microvm.start.resumed", "fork", dst, cid)
    sp = await b.find(dst)
    assert await sp.read_file("x.txt") == b"x"  # the fork's own token works now


async def test_restore_places_a_removed_space_again_and_retention_bounds_disk(
    backend: MicrovmBackend, state_dir: Path
) -> None:
    b = backend
    b.keep_checkpoints = 2
    b.compress = False  # the other tests take compressed ones
    name = _name()
    sp = await b.create(name)
    old_instance = sp.instance_id
    ids = []
    for i in range(3):
        await sp.write_file("n.txt", str(i).encode(), epoch=1)
        ids.append(await b.checkpoint(name))
    assert await b.checkpoints() == sorted(ids[1:])
    # The checkpoint last restored from is never aged out (a crash loop restores it again).
    sp = await b.restore(name, ids[1])
    for _ in range(2):
        await b.checkpoint(name)
    assert ids[1] in await b.checkpoints()
    await sp.write_file("n.txt", b"2", epoch=1)
    ids.append(await b.checkpoint(name))
    await b.delete(name)  # the Space is lost
    sp = await b.restore(name, ids[-1])
    assert sp.instance_id != old_instance
    assert await sp.read_file("n.txt") == b"2"
    assert (await b.find(name)) is not None


async def test_concurrent_operations_in_one_process_do_not_deadlock(
    backend: MicrovmBackend,
) -> None:
    # A nemesis and a coordinator share one process and one event loop: a blocking file
    # lock taken twice there once froze the loop for good.
    b = backend
    name = _name()
    await b.create(name)
    found, _ = await asyncio.wait_for(asyncio.gather(b.find(name), b.kill_daemon(name)), 120)
    assert found is not None
    again, _ = await asyncio.wait_for(asyncio.gather(b.find(name), b.checkpoint(name)), 120)
    res = await again.exec(["sh", "-c", "echo alive"], key=None, epoch=1)
    assert (res.exit_code, res.output.strip()) == (0, b"alive"), res  # the machine answers


async def test_driver_killed_before_recording_its_machine_leaves_no_second_machine(
    backend: MicrovmBackend, state_dir: Path
) -> None:
    import psutil

    b = backend
    name = _name()
    await asyncio.to_thread(_killed_child, state_dir, "microvm.start.spawned", "create", name)
    sock = str(b._qmp_sock(name))
    strays = [
        p for p in psutil.process_iter(["cmdline"]) if sock in " ".join(p.info["cmdline"] or [])
    ]
    assert strays, "the killed driver's QEMU should still be running"
    sp = await b.find(name)  # boots the Space's disk, after removing the stray machine
    assert sp is not None
    await sp.write_file("ok.txt", b"ok", epoch=1)
    assert await sp.read_file("ok.txt") == b"ok"
    left = [
        p for p in psutil.process_iter(["cmdline"]) if sock in " ".join(p.info["cmdline"] or [])
    ]
    assert [p.pid for p in left] == [b.qemu_pid(name)]


async def test_stale_restore_and_checkpoint_are_refused_by_the_host_floor(
    backend: MicrovmBackend,
) -> None:
    """The guest's floor rolls back with a restore; the host's does not. A driver paused
    before a restore and continued after a newer one advanced must change nothing, and a
    restored guest is at the host's floor before anyone else can reach it."""
    from durable_spaces.errors import StaleEpochError

    b = backend
    name = _name()
    sp = await b.create(name)
    await sp.advance_epoch(1)
    cid = await b.checkpoint(name, 1)
    await sp.write_file("after.txt", b"after the checkpoint", epoch=1)
    await sp.advance_epoch(3)  # a newer driver took over
    with pytest.raises(StaleEpochError):
        await b.restore(name, cid, 2)
    with pytest.raises(StaleEpochError):
        await b.checkpoint(name, 2)
    same = await b.find(name)
    assert same is not None and await same.read_file("after.txt") == b"after the checkpoint"
    port = same.port
    restored = await b.restore(name, cid, 3)
    assert restored.port != port, "a restored guest must not answer on the port it had"
    assert await restored.stat("after.txt") is None
    # The guest itself (not only the host copy) is at the floor: a stale command is refused.
    with pytest.raises(StaleEpochError):
        await restored.exec(["true"], key=None, epoch=2)
    assert await restored.current_epoch() == 3


async def test_the_journal_in_the_guest_answers_scans_as_the_daemon_would(
    backend: MicrovmBackend,
) -> None:
    """A microvm Space's scans come from the change journal in its guest
    (``spacesd/guest_journal.pl``): one walk, then each scan the paths the events named,
    each table the one ``find`` through the daemon gives. A restore is a new machine:
    the journal is not trusted across it (a new walk)."""
    from durable_spaces.backends.microvm.microvm_space import MicrovmSpace

    name = _name()
    sp: Any = await backend.create(name)
    await sp.advance_epoch(1)
    r = await sp.exec(["cat", "/proc/sys/fs/inotify/max_user_watches"], key=None, epoch=1)
    assert int(r.output) >= 65536  # set by the guest's init for the journal's watches

    async def oracle() -> object:
        other = MicrovmSpace(sp._host, name, backend.files.read(name), sp._token)
        other._guest.unavailable = "the oracle scans without a journal"
        try:
            return await other.scan()
        finally:
            await other.close()

    steps = [
        "mkdir -p d/e && printf a > a && printf b > d/e/b",
        "printf more >> a && mv d m",
        "ln m/e/b ../hl && printf via-link >> ../hl && rm ../hl",
        "rm -rf m && ln -s a link && chmod 700 a",
    ]
    assert await sp.scan() == await oracle()
    for step in steps:
        r = await sp.exec(["sh", "-c", step], key=None, epoch=1)
        assert r.exit_code == 0, r.output
        assert await sp.scan() == await oracle(), step
    assert sp.scan_stats["guest_full"] == 1 and sp.scan_stats["guest_journal"] == len(steps)
    # The machine's boot id, read by the running helper, is the kernel's.
    kernel = await sp.exec(["cat", "/proc/sys/kernel/random/boot_id"], key=None, epoch=1)
    assert await sp.machine_boot_id() == kernel.output.decode().strip()
    cid = await backend.checkpoint(name)
    await sp.exec(["sh", "-c", "printf after > after"], key=None, epoch=1)
    await sp.scan()
    sp = await backend.restore(name, cid)
    # The adapter advances a restored machine to its own epoch, the same one here: the
    # helper that ran when the checkpoint was taken came back with it and is spared.
    await sp.advance_epoch(1)
    count = ["sh", "-c", "pgrep -c -f '^perl -e # The change journal' || true"]
    assert (await sp.exec(count, key=None, epoch=1)).output.strip() == b"1"
    kernel = await sp.exec(["cat", "/proc/sys/kernel/random/boot_id"], key=None, epoch=1)
    assert await sp.machine_boot_id() == kernel.output.decode().strip()  # a helper started
    table = await sp.scan()
    assert "after" not in table and table == await oracle()
    # The new helper ended the old one at its start: one helper for the workspace.
    assert (await sp.exec(count, key=None, epoch=1)).output.strip() == b"1"
    # A machine booted again has no helper: the old object's answer is None, never the
    # boot id it read before (the adapter then reads the new one by a command), and the
    # next one comes from a new helper in the new boot.
    before = await sp.machine_boot_id()
    await backend.restart(name)
    assert await sp.machine_boot_id() is None
    assert sp._guest.entries == {}  # and its journal is dropped with it
    sp = await backend.find(name)
    after = await sp.machine_boot_id()
    assert after is not None and after != before
