"""The spacesd backend against the real cua-spacesd binary from the cua wheel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import posixpath
import stat
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

import cua

from durable_spaces.backends.spacesd import backend as spacesd_backend
from durable_spaces.backends.spacesd import runtime as spacesd_runtime
from durable_spaces.backends.spacesd.backend import (
    SpacesdBackend,
    unshare_reason,
)
from durable_spaces.backends.spacesd.runtime import check_exec_ledger
from durable_spaces.errors import (
    CapabilityMissingError,
    PathEscapeError,
    SpaceGoneError,
    SpaceUnavailableError,
    StaleEpochError,
)
from durable_spaces.space import ExecState, Space, SpaceBackend

pytestmark = [pytest.mark.spacesd]  # skipped without cua-spacesd (tests/needs.py)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[SpacesdBackend]:
    b = SpacesdBackend(tmp_path / "spaces")
    yield b
    for name in await b.names():
        await b.delete(name)
    await b.close()


async def _ticks(space: Space) -> int:
    return len((await space.read_file("ticks")).split())


def _ns_pids(space_dir: Path) -> list[int]:
    """Live commands whose cwd is the Space's workspace (the loops below), daemon aside."""
    out = []
    for p in psutil.process_iter(["cwd", "status", "name"]):
        if (
            p.info["cwd"] == str(space_dir)
            and p.info["status"] != psutil.STATUS_ZOMBIE
            and p.info["name"] in ("bash", "sleep")
        ):
            out.append(p.pid)
    return out


async def test_protocols_and_capabilities(backend: SpacesdBackend) -> None:
    assert isinstance(backend, SpaceBackend)
    space = await backend.create("caps")
    assert isinstance(space, Space)
    caps = await space.capabilities()
    assert caps.kind == "process"
    assert caps.exec_ledger and "process.exec_ledger" in caps.features
    assert not caps.machine_checkpoints
    assert os.path.isabs(space.root) and os.path.isdir(space.root)
    again = await backend.create("caps")  # idempotent
    assert again.instance_id == space.instance_id


async def test_same_key_runs_once(backend: SpacesdBackend) -> None:
    space = await backend.create("once")
    argv = ["bash", "-c", "echo x >> counter; echo out; echo err >&2; exit 3"]
    first = await space.exec(argv, key="c:1:0@1", epoch=1)
    second = await space.exec(argv, key="c:1:0@1", epoch=1)
    assert (first.exit_code, first.replayed) == (3, False)
    assert (second.exit_code, second.replayed) == (3, True)
    assert b"out\n" in second.output and b"err\n" in second.output
    assert await space.read_file("counter") == b"x\n"
    rec = await space.exec_record("c:1:0@1")
    assert rec.state == ExecState.EXITED and rec.exit_code == 3 and rec.epoch == 1
    assert sorted(rec.output_tail.splitlines()) == [b"err", b"out"]  # two pipes: any order
    assert (await space.exec_record("never")).state == ExecState.UNKNOWN


async def test_reattach_returns_whole_output(backend: SpacesdBackend) -> None:
    space = await backend.create("reattach")
    # It prints 1, then holds until the test made "go" (after its reattach): running
    # while it is reattached to, however slow the machine.
    gate = "while [ ! -e go ]; do sleep 0.01; done"
    argv = ["bash", "-c", f"echo a >> counter; echo 1; {gate}; echo 2; echo 3"]
    first = await space.spawn(argv, key="r@1", epoch=1)
    while await space.stat("counter") is None:
        await asyncio.sleep(0.01)
    assert (await space.exec_record("r@1")).state == ExecState.RUNNING
    second = await space.spawn(argv, key="r@1", epoch=1)
    assert second.reattached and not second.replayed
    await space.write_file("go", b"", epoch=1)
    chunks = [c async for c in second.output()]
    assert (await second.wait()).output == b"1\n2\n3\n" and b"".join(chunks) == b"1\n2\n3\n"
    assert (await first.wait()).output == b"1\n2\n3\n"
    assert await space.read_file("counter") == b"a\n"


async def test_signal_and_missing_program(backend: SpacesdBackend) -> None:
    space = await backend.create("exits")
    r = await space.exec(["bash", "-c", "kill -9 $$"], key=None, epoch=0)
    assert r.exit_code is None and r.signal == 9
    r = await space.exec(["/no/such/program"], key="nf@0", epoch=0)
    assert r.exit_code == 127 and b"not found" in r.output
    r = await space.exec(["sh", "-c", "echo $FOO; pwd"], key=None, epoch=0, env={"FOO": "bar"})
    assert r.output == f"bar\n{space.root}\n".encode()
    r = await space.exec(["wc", "-c"], key=None, epoch=0, stdin=b"z" * 3_000_000)
    assert r.output.strip() == b"3000000"


async def test_restart_mid_command_reads_lost_and_stops_writing(backend: SpacesdBackend) -> None:
    space = await backend.create("restart")
    loop = "while true; do echo t >> ticks; sleep 0.02; done"
    ex = await space.spawn(["bash", "-c", loop], key="loop@1", epoch=1)
    await space.exec(["bash", "-c", f"({loop}) & disown"], key="bg@1", epoch=1)  # an orphan
    await asyncio.sleep(0.3)
    assert _ns_pids(Path(space.root))
    await backend.restart("restart")
    with pytest.raises(SpaceUnavailableError):
        await asyncio.wait_for(ex.wait(), 10)
    assert _ns_pids(Path(space.root)) == []  # the orphan died with the namespace too
    n = await _ticks(space)
    await asyncio.sleep(0.3)
    assert await _ticks(space) == n
    rec = await space.exec_record("loop@1")
    assert rec.state == ExecState.LOST
    again = await space.exec(["bash", "-c", "echo rerun >> ticks"], key="loop@1", epoch=1)
    assert again.replayed and again.exit_code is None
    assert await _ticks(space) == n  # not run again
    assert (await space.exec_record("bg@1")).state == ExecState.EXITED  # finished before
    assert await space.current_epoch() == 1  # the floor survives


async def test_kill_daemon_kills_its_commands(backend: SpacesdBackend) -> None:
    space = await backend.create("crash")
    await space.spawn(
        ["bash", "-c", "while true; do echo t >> ticks; sleep 0.02; done"], key="k@1", epoch=1
    )
    await asyncio.sleep(0.2)
    await backend.kill_daemon("crash")
    assert (await space.exec_record("k@1")).state == ExecState.LOST
    if unshare_reason() is None:  # documented: only the PID namespace takes commands along
        n = await _ticks(space)
        await asyncio.sleep(0.3)
        assert await _ticks(space) == n


async def test_epoch_fence(backend: SpacesdBackend) -> None:
    space = await backend.create("fence")
    assert await space.current_epoch() == 0
    old = await space.spawn(["sleep", "30"], key="old@1", epoch=1)
    await space.advance_epoch(5)
    await space.advance_epoch(5)  # equal: no-op
    assert await space.current_epoch() == 5
    res = await asyncio.wait_for(old.wait(), 10)
    assert res.signal == 9  # killed by the advance
    with pytest.raises(StaleEpochError) as e:
        await space.exec(["true"], key="k@4", epoch=4)
    assert (e.value.epoch, e.value.floor, e.value.where) == (4, 5, "space")
    with pytest.raises(StaleEpochError):
        await space.exec(["true"], key=None, epoch=1)
    with pytest.raises(StaleEpochError):
        await space.advance_epoch(3)
    assert (await space.exec(["true"], key="k@5", epoch=5)).exit_code == 0


async def test_token_never_leaks(backend: SpacesdBackend) -> None:
    space = await backend.create("secret")
    home = backend.state_dir / "secret"
    token = (home / "token").read_text().strip()
    assert len(token) >= 32
    assert stat.S_IMODE((home / "token").stat().st_mode) == 0o600
    for p in psutil.process_iter(["cmdline"]):
        assert token not in " ".join(p.info["cmdline"] or [])
    r = await space.exec(["env"], key=None, epoch=0)
    assert token.encode() not in r.output  # the daemon strips it from commands
    await backend.restart("secret")
    assert token not in (home / "daemon.log").read_text()
    assert token not in repr(space)
    await backend.delete("secret")
    with pytest.raises(SpaceGoneError) as e:
        await space.exec(["true"], key=None, epoch=0)
    assert token not in str(e.value)


def test_exec_ledger_check() -> None:
    def caps(*features: tuple[str, bool]) -> cua.SpacesdCapabilities:
        return cua.SpacesdCapabilities(
            version="0.0-test",
            protocol_version=1,
            protocol_revision=0,
            os_family="linux",
            os_name="x",
            os_version="1",
            arch="x86_64",
            hostname="h",
            initialized=True,
            features=[
                cua.SpacesdFeature(name=n, supported=s, limitation=None, attributes={})
                for n, s in features
            ],
            json="{}",
        )

    check_exec_ledger(caps(("pty", True), ("process.exec_ledger", True)))
    with pytest.raises(CapabilityMissingError, match=r"process\.exec_ledger"):
        check_exec_ledger(caps(("pty", True)))
    with pytest.raises(CapabilityMissingError):
        check_exec_ledger(caps(("process.exec_ledger", False)))


async def test_files_confined(backend: SpacesdBackend, tmp_path: Path) -> None:
    space = await backend.create("files")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    await space.write_file("d/f.txt", b"one", 0o640, epoch=1)
    assert await space.read_file("d/f.txt") == b"one"
    st = await space.stat("d/f.txt")
    assert st is not None and (st.kind, st.mode, st.size) == ("file", 0o640, 3)
    await space.write_file(f"{space.root}/d/f.txt", b"two", epoch=1)  # absolute inside: fine
    assert (await space.stat("d/f.txt")).mode == 0o640  # type: ignore[union-attr]
    assert await space.list_dir("d") == ["f.txt"]
    for bad in ["../x", "d/../../x", str(outside / "secret")]:
        with pytest.raises(PathEscapeError):
            await space.read_file(bad)
        with pytest.raises(PathEscapeError):
            await space.write_file(bad, b"pwn", epoch=1)
    await space.symlink("out", str(outside), epoch=1)
    await space.symlink("outf", str(outside / "secret"), epoch=1)
    st = await space.stat("out")
    assert st is not None and st.kind == "symlink" and st.target == str(outside)
    for op in (
        space.read_file("out/secret"),
        space.write_file("out/new", b"pwn", epoch=1),
        space.read_file("outf"),
        space.list_dir("out"),
        space.remove("out/secret", epoch=1),
        space.symlink("out/l", "x", epoch=1),
    ):
        with pytest.raises(PathEscapeError):
            await op
    await space.write_file("outf", b"mine", epoch=1)  # replaces the link, never writes through it
    assert (outside / "secret").read_text() == "s"
    assert sorted(os.listdir(outside)) == ["secret"]
    await space.remove("out", epoch=1)  # the link, not its target
    assert (outside / "secret").exists()
    assert await space.stat("out") is None
    await space.remove("missing", epoch=1)
    await space.remove("d", recursive=True, epoch=1)
    assert await space.stat("d") is None
    with pytest.raises(FileNotFoundError):
        await space.read_file("nope")


async def test_scan_sees_every_change(backend: SpacesdBackend) -> None:
    space = await backend.create("scan")
    await space.write_file("a.txt", b"a", epoch=1)
    await space.write_file("sub/b.sh", b"#!/bin/sh\n", 0o755, epoch=1)
    await space.write_file("skip/x", b"x", epoch=1)
    await space.symlink("link", "a.txt", epoch=1)
    await asyncio.sleep(0.1)  # out of the racy window
    t1 = await space.scan(exclude=["skip"])
    assert set(t1) == {"a.txt", "sub/b.sh", "link"}
    assert t1["sub/b.sh"].mode == 0o755 and t1["link"].target == "a.txt"
    hashed = space.scan_stats["hashed"]  # type: ignore[attr-defined]
    assert (await space.scan(exclude=["skip"])) == t1
    assert space.scan_stats["hashed"] == hashed  # type: ignore[attr-defined]
    await space.write_file("a.txt", b"A", epoch=1)
    await space.exec(["chmod", "600", "sub/b.sh"], key=None, epoch=0)
    await space.symlink("link", "sub/b.sh", epoch=1)
    t2 = await space.scan(exclude=["skip"])
    assert t2["a.txt"].sha256 != t1["a.txt"].sha256
    assert t2["sub/b.sh"].mode == 0o600 and t2["link"].target == "sub/b.sh"
    await space.remove("a.txt", epoch=1)
    assert "a.txt" not in await space.scan()
    assert set(await space.scan("sub")) == {"sub/b.sh"}
    await space.exec(["touch", "bad\\name"], key=None, epoch=0)
    assert (await space.scan())["bad\\name"].kind == "unsupported"
    await space.remove("bad\\name", epoch=1)
    await space.exec(["touch", "new\nline"], key=None, epoch=0)
    assert (await space.scan())["new\nline"].kind == "unsupported"


async def test_find_after_driver_restart_and_host_reboot(tmp_path: Path) -> None:
    state = tmp_path / "spaces"
    b1 = SpacesdBackend(state)
    try:
        space = await b1.create("persist")
        await space.exec(["sh", "-c", "echo hi > f"], key="p@2", epoch=2)
        await b1.close()
        b2 = SpacesdBackend(state)  # a new driver process would do the same
        assert await b2.names() == ["persist"]
        found = await b2.find("persist")
        assert found is not None and found.instance_id == space.instance_id
        assert (await found.exec_record("p@2")).state == ExecState.EXITED
        # The host rebooted: nothing runs; find boots the daemon on the same data.
        b2._daemon("persist").kill()
        with pytest.raises(SpaceUnavailableError):
            await found.exec(["true"], key=None, epoch=2)
        again = await b2.find("persist")
        assert again is not None and await again.read_file("f") == b"hi\n"
        assert await again.current_epoch() == 2
        assert await b2.find("nothing") is None
        await b2.close()
    finally:
        await SpacesdBackend(state).delete("persist")


async def test_warm_up_starts_the_runtime_before_the_state_dir_exists(tmp_path: Path) -> None:
    # A session's first spare warms up before its first driver made the state dir: its
    # runtime must start anyway (without creating anything), and be the one the driver
    # uses later, so the first resume does not pay the runtime's start.
    state = tmp_path / "not-made-yet"
    SpacesdBackend.warm_up(state)
    assert not state.exists()
    home = str(state.absolute() / ".cua-sdk")
    started = spacesd_runtime._runtimes.get(home)
    assert started is not None
    b = SpacesdBackend(state)
    try:
        space = await b.create("warm")
        assert (await space.capabilities()).exec_ledger
        assert spacesd_runtime.runtime(b._sdk_home()) is started
    finally:
        await b.delete("warm")
        await b.close()


def test_warm_up_leaves_the_binary_check_to_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The spare is ready once its runtime started; the binary's run goes on beside it.
    # The check is held until the test lets it go: had warm_up waited for it, it would
    # have returned only once the check had (the hold's 600 s: a hang's end, not a bound).
    release, ran, checked = threading.Event(), threading.Event(), threading.Event()

    def slow_check() -> str | None:
        ran.set()
        release.wait(600)
        checked.set()
        return None

    monkeypatch.setattr(spacesd_backend, "unavailable_reason", slow_check)
    SpacesdBackend.warm_up(tmp_path / "s")
    try:
        assert not checked.is_set(), "warm_up waited for the binary's run"
        assert str((tmp_path / "s").absolute() / ".cua-sdk") in spacesd_runtime._runtimes
        assert ran.wait(600)  # the check does run, beside
    finally:
        release.set()


def test_a_check_under_way_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A binary that runs slowly and fails: a caller while the first run is under way gets
    # its answer, never "available" from a check half made.
    fake = tmp_path / "cua-spacesd"
    fake.write_text("#!/bin/sh\nsleep 0.5\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(spacesd_backend, "daemon_binary", lambda: fake)
    monkeypatch.setattr(spacesd_backend, "_unavailable", False)
    first = threading.Thread(target=spacesd_backend.unavailable_reason)
    first.start()
    time.sleep(0.1)
    try:
        assert spacesd_backend.unavailable_reason() == "cua-spacesd --version exited 3"
    finally:
        first.join()


async def test_deleted_space_is_gone(backend: SpacesdBackend) -> None:
    space = await backend.create("gone")
    await backend.delete("gone")
    await backend.delete("gone")  # missing: not an error
    for op in (
        space.exec(["true"], key="g@0", epoch=0),
        space.read_file("x"),
        space.exec_record("g@0"),
    ):
        with pytest.raises(SpaceGoneError):
            await op
    assert await backend.find("gone") is None
    fresh = await backend.create("gone")
    assert fresh.instance_id != space.instance_id
    with pytest.raises(SpaceGoneError):  # the old handle never reaches the new instance
        await space.exec(["true"], key=None, epoch=0)


async def test_process_group_fallback(tmp_path: Path) -> None:
    b = SpacesdBackend(tmp_path / "pg", isolation="pgroup")
    try:
        space = await b.create("pg")
        ex = await space.spawn(
            ["bash", "-c", "while true; do echo t >> ticks; sleep 0.02; done"], key="l@1", epoch=1
        )
        await asyncio.sleep(0.2)
        await b.restart("pg")  # killpg: the group dies
        with pytest.raises(SpaceUnavailableError):
            await asyncio.wait_for(ex.wait(), 10)
        n = await _ticks(space)
        await asyncio.sleep(0.3)
        assert await _ticks(space) == n
        assert (await space.exec_record("l@1")).state == ExecState.LOST
    finally:
        for name in await b.names():
            await b.delete(name)


def _serving(data_dir: Path) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "name", "status"])
        if str(data_dir) in (p.info["cmdline"] or [])
        and p.info["name"] != "unshare"
        and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


async def test_untracked_daemon_is_killed_before_a_start(backend: SpacesdBackend) -> None:
    """A driver killed between starting a daemon and recording it leaves a daemon the
    state file does not know; the next start must not put a second one on the ledger."""
    space = await backend.create("stray")
    await space.exec(["true"], key="s@1", epoch=1)
    home = backend.state_dir / "stray"
    state = json.loads((home / "state.json").read_text())
    (home / "state.json").write_text(json.dumps({**state, "daemon_pid": 0, "leader_pid": 0}))
    assert len(_serving(home / "data")) == 1
    found = await backend.find("stray")
    assert found is not None
    assert len(_serving(home / "data")) == 1
    assert (await found.exec_record("s@1")).state == ExecState.EXITED


async def test_concurrent_lifecycle_calls_in_one_loop(backend: SpacesdBackend) -> None:
    spaces = await asyncio.wait_for(
        asyncio.gather(backend.create("same"), backend.create("same"), backend.find("same")),
        60,
    )
    assert len({s.instance_id for s in spaces if s is not None}) == 1
    await asyncio.wait_for(asyncio.gather(backend.restart("same"), backend.create("other")), 60)
    assert await backend.names() == ["other", "same"]


async def test_advance_epoch_kills_orphans_of_older_commands(tmp_path: Path) -> None:
    """A background child of an older command (reparented to the daemon, which does not
    track it) must not survive a newer epoch: it would write after a restore."""
    from durable_spaces.backends.spacesd.backend import SpacesdBackend

    backend = SpacesdBackend(tmp_path / "spaces")
    try:
        space = await backend.create("orphans")
        if getattr(space, "daemon_pid", 0) <= 0:
            pytest.skip("unshare not permitted here: process-group fallback has no sweep")
        await space.advance_epoch(1)
        await space.exec(
            ["sh", "-c", "(while true; do echo x >> bg.txt; sleep 0.05; done) & echo started"],
            key="orphans:1@1",
            epoch=1,
        )
        await asyncio.sleep(0.3)
        await space.advance_epoch(2)
        size = (Path(space.root) / "bg.txt").stat().st_size
        await asyncio.sleep(0.5)
        assert (Path(space.root) / "bg.txt").stat().st_size == size, "the orphan still writes"
    finally:
        for name in await backend.names():
            await backend.delete(name)
        await backend.close()


async def test_a_write_cut_short_never_lands(backend: SpacesdBackend) -> None:
    """A write's bytes stream into a command; a stream cut short (the caller killed
    mid-upload) ends ``cat`` early, and that prefix must never be renamed into place."""
    from durable_spaces.backends.spacesd.spacesd_space import MUTATE

    space = await backend.create("cut")
    await space.write_file("f.txt", b"old", epoch=1)
    staging = posixpath.join(posixpath.dirname(space.root), ".ds-staging")
    argv = ["sh", "-c", MUTATE, "ds-mutate", "write", space.root, staging, "644:100", "f.txt"]
    r = await space.exec(argv, key=None, epoch=1, cwd="/", stdin=b"x" * 50)
    assert r.exit_code == 96, r.output
    assert await space.read_file("f.txt") == b"old"
    assert await space.list_dir(".") == ["f.txt"]


async def test_a_write_killed_by_an_advance_never_lands(backend: SpacesdBackend) -> None:
    """The write's command is running (bytes not sent) when a newer epoch arrives: the
    advance kills it, the old driver's write raises StaleEpochError, nothing lands."""
    space = await backend.create("adv")
    await space.advance_epoch(1)
    await space.write_file("f.txt", b"old", epoch=1)
    other = await backend.find("adv")
    assert other is not None

    feeding, advanced = asyncio.Event(), asyncio.Event()

    async def advance_soon() -> None:
        await feeding.wait()  # the write's command runs, waiting for its bytes
        await other.advance_epoch(2)
        advanced.set()

    from durable_spaces.backends.spacesd import spacesd_space

    real_feed = spacesd_space.SpacesdSpace._feed

    async def slow_feed(self: Any, ex: Any, data: bytes) -> None:
        feeding.set()
        await advanced.wait()  # the advance lands while the command waits for bytes
        await real_feed(self, ex, data)

    task = asyncio.create_task(advance_soon())
    spacesd_space.SpacesdSpace._feed = slow_feed  # type: ignore[method-assign]
    try:
        with pytest.raises(StaleEpochError):
            await space.write_file("f.txt", b"stale", epoch=1)
    finally:
        spacesd_space.SpacesdSpace._feed = real_feed  # type: ignore[method-assign]
        if not feeding.is_set():  # refused before its bytes: no advance to wait for
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert await other.read_file("f.txt") == b"old"


async def test_a_daemon_scan_keeps_the_small_files_it_read_for_read_files(
    backend: SpacesdBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the daemon (no host scan): the changed small files come in one ``tar`` and
    are hashed here, their bytes kept, so ``read_files`` of them runs no command; a large
    one is hashed in the Space and read by a command. Every hash is the file's."""
    import hashlib

    from durable_spaces.backends.spacesd import bulk
    from durable_spaces.backends.spacesd import spacesd_space as sd

    space = await backend.create("kept")
    space._host = None  # type: ignore[attr-defined]  # the daemon's scan, as microvm's
    await space.write_file("old.txt", b"old", epoch=1)
    await space.scan()
    files = {f"d/f{i}.txt": f"small {i}\n".encode() * (i + 1) for i in range(3)}
    files["big.bin"] = os.urandom(bulk.KEEP_MAX + 1)
    for path, data in files.items():
        await space.write_file(path, data, epoch=1)
    table = await space.scan()
    for path, data in files.items():
        assert table[path].sha256 == hashlib.sha256(data).hexdigest(), path
    runs: list[object] = []
    real = sd.SpacesdSpace._run

    async def counted(self: object, argv: object, *a: object, **k: object) -> object:
        runs.append(argv)
        return await real(self, argv, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(sd.SpacesdSpace, "_run", counted)
    small = sorted(p for p in files if p.startswith("d/"))
    assert await space.read_files(small) == {p: files[p] for p in small}
    assert runs == []
    assert await space.read_files([*small, "big.bin"]) == {p: files[p] for p in files}
    assert len(runs) == 1
