"""Conformance: commands, the exec ledger, epochs and the Space's machine, per backend."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from durable_spaces.errors import SpaceUnavailableError, StaleEpochError
from durable_spaces.space import (
    EXEC_LEDGER,
    OUTPUT_TAIL_BYTES,
    ExecResult,
    ExecState,
    Space,
    SpaceBackend,
)

EPOCH = 1  # as in conftest.py
Key = Callable[[str], str]
Sh = Callable[..., Awaitable[ExecResult]]

#: Appends to ``beat`` every 50 ms until killed: a side effect that shows it is alive.
LOOP = "echo run >> {c}; while :; do echo x >> {b}; sleep 0.05; done"


async def _lines(space: Space, path: str) -> int:
    st = await space.stat(path)
    return 0 if st is None else len((await space.read_file(path)).splitlines())


async def _until(cond: Callable[[], object], timeout: float = 300.0) -> None:
    """Until ``cond`` holds: a wait for an event. The deadline only turns a hang into a
    failure, and is long enough for a heavily loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def _stopped(space: Space, path: str) -> bool:
    """True when ``path`` does not grow over a while (its writer is dead)."""
    before = await space.read_file(path)
    await asyncio.sleep(0.4)
    return await space.read_file(path) == before


async def test_capabilities_report_exec_ledger(backend: SpaceBackend, space: Space) -> None:
    caps = await space.capabilities()
    assert caps.exec_ledger is True
    assert EXEC_LEDGER in caps.features
    assert isinstance(caps.kind, str) and caps.kind
    again = await backend.create(space.name)  # create is idempotent
    assert again.instance_id == space.instance_id
    assert space.name in await backend.names()
    found = await backend.find(space.name)
    assert found is not None and found.instance_id == space.instance_id


async def test_same_key_runs_once(space: Space, key: Key) -> None:
    k = key("once")
    first = await space.exec(
        ["sh", "-c", "echo run >> counter; echo out; exit 4"], key=k, epoch=EPOCH
    )
    second = await space.exec(
        ["sh", "-c", "echo run >> counter; echo out; exit 4"], key=k, epoch=EPOCH
    )
    assert (first.exit_code, first.output, first.replayed) == (4, b"out\n", False)
    assert (second.exit_code, second.output, second.replayed) == (4, b"out\n", True)
    assert await _lines(space, "counter") == 1
    # Concurrent callers with one key: still one run.
    k2 = key("concurrent")
    argv = ["sh", "-c", "echo run >> counter2; sleep 0.5; echo done"]
    results = await asyncio.gather(*(space.exec(argv, key=k2, epoch=EPOCH) for _ in range(3)))
    assert await _lines(space, "counter2") == 1
    assert all(r.exit_code == 0 and r.output.endswith(b"done\n") for r in results)


async def test_reattach_after_detach_returns_whole_output(
    backend: SpaceBackend, space: Space, key: Key
) -> None:
    k = key("reattach")
    script = "echo run >> counter; for i in 1 2 3 4 5 6; do echo line $i; sleep 0.2; done"
    ex = await space.spawn(["sh", "-c", script], key=k, epoch=EPOCH)
    async for chunk in ex.output():
        assert chunk.startswith(b"line 1")
        break
    await ex.detach()
    del ex
    # Another handle on the same Space (as a new driver would get) reattaches by key.
    other = await backend.find(space.name)
    assert other is not None
    again = await other.spawn(["sh", "-c", script], key=k, epoch=EPOCH)
    assert again.reattached and not again.replayed
    result = await again.wait()
    assert result.exit_code == 0 and result.reattached
    assert result.output == b"".join(f"line {i}\n".encode() for i in range(1, 7))
    assert await _lines(space, "counter") == 1


_CHILD = r"""
import asyncio, sys
from durable_spaces.backends import open_backend

async def main(backend, state_dir, space_name, key, script):
    space = await open_backend(backend, state_dir).find(space_name)
    await space.spawn(["sh", "-c", script], key=key, epoch=int(sys.argv[6]))
    print("spawned", flush=True)
    await asyncio.sleep(120)

asyncio.run(main(*sys.argv[1:6]))
"""


async def test_reattach_after_caller_sigkilled(
    backend_name: str, state_dir: Path, space: Space, key: Key
) -> None:
    """A driver SIGKILLed right after spawning leaves the command running; the next one
    reattaches and gets the whole output."""
    k = key("killed-driver")
    script = "echo run >> counter; for i in 1 2 3 4 5 6 7 8; do echo line $i; sleep 0.25; done"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        backend_name,
        str(state_dir),
        space.name,
        k,
        script,
        str(EPOCH),
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 60)
    child.kill()
    await child.wait()
    assert line == b"spawned\n"
    ex = await space.spawn(["sh", "-c", script], key=k, epoch=EPOCH)
    assert ex.reattached
    result = await ex.wait()
    assert result.exit_code == 0
    assert result.output == b"".join(f"line {i}\n".encode() for i in range(1, 9))
    assert await _lines(space, "counter") == 1


async def test_replay_of_exited_command(space: Space, key: Key) -> None:
    k = key("replay")
    first = await space.exec(["sh", "-c", "echo hello; echo oops >&2; exit 7"], key=k, epoch=EPOCH)
    # stdout and stderr come through separate pipes on a daemon: their interleaving is not
    # a property of the Space, their content and the replay's fidelity are.
    assert sorted(first.output.splitlines()) == [b"hello", b"oops"]
    rec = await space.exec_record(k)
    assert rec.state is ExecState.EXITED and rec.exit_code == 7
    assert sorted(rec.output_tail.splitlines()) == [b"hello", b"oops"]
    again = await space.exec(["sh", "-c", "exit 0"], key=k, epoch=EPOCH)
    assert again.replayed and again.exit_code == 7
    assert sorted(again.output.splitlines()) == [b"hello", b"oops"]
    assert (await space.exec_record(key("never"))).state is ExecState.UNKNOWN


async def test_replay_tail_is_capped(space: Space, key: Key) -> None:
    k = key("big")
    full = b"".join(b"%d\n" % i for i in range(1, 40001))  # ~230 KiB
    first = await space.exec(["seq", "1", "40000"], key=k, epoch=EPOCH)
    assert first.output == full
    replay = await space.exec(["seq", "1", "40000"], key=k, epoch=EPOCH)
    assert replay.replayed
    assert OUTPUT_TAIL_BYTES - 4096 <= len(replay.output) <= OUTPUT_TAIL_BYTES
    assert full.endswith(replay.output)
    assert (await space.exec_record(k)).output_tail == replay.output


async def test_output_streams_before_exit(space: Space) -> None:
    ex = await space.spawn(["sh", "-c", "echo a; sleep 1; echo b"], key=None, epoch=EPOCH)
    seen: list[tuple[float, bytes]] = []
    async for chunk in ex.output():
        seen.append((time.monotonic(), chunk))
    result = await ex.wait()
    assert result.output == b"a\nb\n" and result.exit_code == 0
    assert seen[0][1] == b"a\n"
    assert seen[-1][0] - seen[0][0] > 0.5  # "a" came before the command ended
    chunks: list[bytes] = []
    r = await space.exec(
        ["sh", "-c", "echo x; sleep 0.3; echo y"], key=None, epoch=EPOCH, on_output=chunks.append
    )
    assert b"".join(chunks) == r.output == b"x\ny\n" and len(chunks) >= 2


async def test_missing_program_is_an_exit_status(space: Space, key: Key) -> None:
    r = await space.exec(["/nonexistent/ds-program"], key=None, epoch=EPOCH)
    assert r.exit_code not in (0, None)
    k = key("missing")
    r = await space.exec(["ds-no-such-program-on-path"], key=k, epoch=EPOCH)
    assert r.exit_code not in (0, None)
    assert (await space.exec_record(k)).state is ExecState.EXITED


async def test_stdin_env_and_cwd(space: Space, sh: Sh) -> None:
    r = await space.exec(["cat"], key=None, epoch=EPOCH, stdin=b"from stdin")
    assert r.output == b"from stdin"
    r = await sh("pwd; echo $DS_CONF_VAR", env={"DS_CONF_VAR": "v1"})
    assert r.output == f"{space.root}\nv1\n".encode()
    await space.write_file("sub/x", b"", epoch=EPOCH)
    r = await sh("pwd", cwd="sub")
    assert r.output.decode().strip() == f"{space.root}/sub"


async def test_machine_restart_mid_command(
    backend: SpaceBackend, space: Space, sh: Sh, key: Key
) -> None:
    await space.advance_epoch(3)
    await space.write_file("keep.txt", b"kept", epoch=3)
    done = key("done")
    await space.exec(["sh", "-c", "echo finished"], key=done, epoch=3)
    k = key("loop")
    ex = await space.spawn(["sh", "-c", LOOP.format(c="counter", b="beat")], key=k, epoch=3)
    waiter = asyncio.create_task(ex.wait())
    await _until(lambda: _lines(space, "beat"))
    assert (await space.exec_record(k)).state is ExecState.RUNNING
    await backend.restart(space.name)
    with pytest.raises(SpaceUnavailableError):
        await asyncio.wait_for(waiter, 30)
    assert (await space.exec_record(k)).state is ExecState.LOST
    assert await _stopped(space, "beat"), "the command kept running after the restart"
    # Files, finished records and the epoch floor survive; the lost key never reruns.
    assert await space.read_file("keep.txt") == b"kept"
    rec = await space.exec_record(done)
    assert rec.state is ExecState.EXITED and rec.output_tail == b"finished\n"
    assert await space.current_epoch() == 3
    again = await space.exec(["sh", "-c", LOOP.format(c="counter", b="beat")], key=k, epoch=3)
    assert again.replayed
    assert await _lines(space, "counter") == 1
    assert (await sh("echo alive", epoch=3)).output == b"alive\n"


async def test_daemon_killed_mid_command(backend: SpaceBackend, space: Space, key: Key) -> None:
    k = key("loop")
    await space.spawn(["sh", "-c", LOOP.format(c="counter", b="beat")], key=k, epoch=EPOCH)
    await _until(lambda: _lines(space, "beat"))
    await backend.kill_daemon(space.name)
    assert (await space.exec_record(k)).state is ExecState.LOST
    again = await space.exec(["sh", "-c", "echo run >> counter"], key=k, epoch=EPOCH)
    assert again.replayed
    assert await _lines(space, "counter") == 1


async def test_key_wrongly_vouched_new_never_runs_twice(
    backend: SpaceBackend, space: Space, key: Key
) -> None:
    """``spawn(new_key=True)`` may skip the ledger's read (the adapter's start mark made
    the key); vouched for wrongly (exited, running, lost), the key still runs once."""
    argv = ["sh", "-c", "echo run >> counter; echo first"]
    done = key("vouched-exited")
    await space.exec(argv, key=done, epoch=EPOCH)
    again = await space.spawn(
        ["sh", "-c", "echo run >> counter"], key=done, epoch=EPOCH, new_key=True
    )
    assert (await again.wait()).exit_code == 0
    assert await _lines(space, "counter") == 1
    running = key("vouched-running")
    loop = ["sh", "-c", LOOP.format(c="counter2", b="beat")]
    await space.spawn(loop, key=running, epoch=EPOCH)
    await _until(lambda: _lines(space, "beat"))
    await space.spawn(loop, key=running, epoch=EPOCH, new_key=True)
    await asyncio.sleep(0.3)
    assert await _lines(space, "counter2") == 1
    await backend.kill_daemon(space.name)
    assert (await space.exec_record(running)).state is ExecState.LOST
    lost = await space.spawn(loop, key=running, epoch=EPOCH, new_key=True)
    res = await asyncio.wait_for(lost.wait(), 30)
    assert res.exit_code != 0  # unknown (None), or the daemon's "outcome unknown" error
    assert await _lines(space, "counter2") == 1
    await space.advance_epoch(EPOCH + 1)
    with pytest.raises(StaleEpochError):
        await space.spawn(argv, key=key("vouched-stale"), epoch=EPOCH, new_key=True)


async def test_stale_epochs_refused(space: Space, key: Key) -> None:
    assert await space.current_epoch() == 0
    await space.advance_epoch(2)
    assert await space.current_epoch() == 2
    with pytest.raises(StaleEpochError):
        await space.exec(["sh", "-c", "echo run >> stale"], key=None, epoch=1)
    with pytest.raises(StaleEpochError):
        await space.exec(["sh", "-c", "echo run >> stale"], key=key("stale"), epoch=1)
    with pytest.raises(StaleEpochError):
        await space.spawn(["sh", "-c", "echo run >> stale"], key=None, epoch=1)
    assert await space.stat("stale") is None
    assert (await space.exec_record(key("stale"))).state is ExecState.UNKNOWN
    await space.advance_epoch(2)  # equal: no-op
    assert await space.current_epoch() == 2
    with pytest.raises(StaleEpochError):
        await space.advance_epoch(1)
    assert await space.current_epoch() == 2
    assert (await space.exec(["true"], key=None, epoch=2)).exit_code == 0
    assert (await space.exec(["true"], key=None, epoch=5)).exit_code == 0  # newer is fine


async def test_advance_epoch_kills_older_processes(space: Space, key: Key) -> None:
    old, new = key("old"), key("new")
    await space.spawn(["sh", "-c", LOOP.format(c="c1", b="beat1")], key=old, epoch=1)
    # cua-spacesd raises its floor when a newer epoch arrives: on a slow machine (microvm
    # under TCG) the epoch-2 spawn would kill this one before it ever wrote a beat.
    await _until(lambda: _lines(space, "beat1"))
    await space.spawn(["sh", "-c", LOOP.format(c="c2", b="beat2")], key=new, epoch=2)
    await _until(lambda: _lines(space, "beat2"))
    await space.advance_epoch(2)
    assert (await space.exec_record(old)).state is not ExecState.RUNNING
    assert await _stopped(space, "beat1"), "a process of epoch 1 survived advance_epoch(2)"
    assert (await space.exec_record(new)).state is ExecState.RUNNING
    assert not await _stopped(space, "beat2"), "advance_epoch(2) killed a process of epoch 2"
