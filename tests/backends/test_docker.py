"""The docker backend's own properties (the shared contract is in tests/conformance).

Real Docker, the real image from ``make space-image``, the real daemon inside; skipped
with the reason when the engine or the image is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_spaces.backends.docker.backend import (
    INSTANCE_LABEL,
    OWNER,
    OWNER_LABEL,
    SPACE_LABEL,
    TOKEN_PATH,
    DockerBackend,
)
from durable_spaces.backends.docker.docker_space import DockerSpace
from durable_spaces.errors import SpaceGoneError, SpaceUnavailableError
from durable_spaces.space import ExecState

pytestmark = pytest.mark.docker  # skipped without Docker (tests/needs.py)


def _name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[DockerBackend]:
    b = DockerBackend(tmp_path / "state")
    try:
        yield b
    finally:
        await b.delete_all()
        await b.close()


async def _ps(space: object) -> str:
    res = await space.exec(["ps", "-eo", "pid,ppid,args"], key=None, epoch=0)  # type: ignore[attr-defined]
    return res.output.decode()


async def _size(space: object, path: str) -> int:
    st = await space.stat(path)  # type: ignore[attr-defined]
    return 0 if st is None else int(st.size)


async def test_labels_and_cleanup_touch_only_our_containers(
    backend: DockerBackend, tmp_path: Path
) -> None:
    name = _name()
    space = await backend.create(name)
    engine = backend.engine()
    c = engine.containers.get(space.container_id)
    assert c.labels[OWNER_LABEL] == OWNER
    assert c.labels[SPACE_LABEL] == name
    assert c.labels[INSTANCE_LABEL] == space.instance_id

    # A container that is not ours (same image, no labels) and one of another state dir.
    foreign = engine.containers.run(backend.image, detach=True, labels={"someone": "else"})
    other = DockerBackend(tmp_path / "other-state", image=backend.image)
    try:
        await other.create(name)  # the same Space name, another owner's state dir
        assert await backend.names() == [name]
        assert await other.names() == [name]
        assert await backend.delete_all() == [name]
        assert await backend.names() == []
        foreign.reload()
        assert foreign.status == "running"
        assert await other.find(name) is not None
    finally:
        foreign.remove(force=True)
        await other.delete_all()
        await other.close()


async def test_token_never_in_inspect_env_or_commands(backend: DockerBackend) -> None:
    name = _name()
    space = await backend.create(name)
    token = backend._read_token(name)
    assert len(token) >= 32
    mode = stat.S_IMODE(os.stat(backend._token_path(name)).st_mode)
    assert mode == 0o600
    c = backend.engine().containers.get(space.container_id)
    dumped = json.dumps(c.attrs)
    assert token not in dumped
    assert token not in json.dumps(c.labels)
    mounts = [m for m in c.attrs["Mounts"] if m["Destination"] == TOKEN_PATH]
    assert len(mounts) == 1 and mounts[0]["RW"] is False
    assert token not in c.logs().decode(errors="replace")
    env = await space.exec(["env"], key=None, epoch=0)
    assert env.exit_code == 0 and token.encode() not in env.output
    res = await space.exec(["id", "-un"], key=None, epoch=0)
    assert res.output.strip() == b"cua"
    # The daemon really takes its token from the file: another token is refused.
    intruder = DockerSpace(
        backend,
        name=name,
        container_id=space.container_id,
        port=space.port,
        token="not-" + token,
        instance_id=space.instance_id,
        root=space.root,
        user="cua",
        sdk_home=backend._sdk_home(),
    )
    with pytest.raises(SpaceUnavailableError):
        await intruder.read_file("x")


async def test_restart_kills_every_process(backend: DockerBackend) -> None:
    name = _name()
    space = await backend.create(name)
    await space.spawn(
        ["bash", "-c", "while true; do echo x >> loop; sleep 0.05; done"], key="k:loop@1", epoch=1
    )
    await space.exec(["bash", "-c", "setsid sleep 300 >/dev/null 2>&1 &"], key="k:bg@1", epoch=1)
    for _ in range(100):
        if await _size(space, "loop") > 0:
            break
        await asyncio.sleep(0.05)
    assert await _size(space, "loop") > 0
    await backend.restart(name)
    before = await _size(space, "loop")
    await asyncio.sleep(0.5)
    assert await _size(space, "loop") == before  # nothing keeps writing
    ps = await _ps(space)
    assert "while true" not in ps and "sleep 300" not in ps
    assert (await space.exec_record("k:loop@1")).state == ExecState.LOST


async def test_ledger_and_epoch_survive_restart(backend: DockerBackend) -> None:
    name = _name()
    space = await backend.create(name)
    done = await space.exec(["bash", "-c", "echo finished"], key="k:done@3", epoch=3)
    assert done.exit_code == 0
    await space.spawn(["sleep", "60"], key="k:run@3", epoch=3)
    await space.advance_epoch(3)
    await backend.restart(name)
    rec = await space.exec_record("k:done@3")
    assert rec.state == ExecState.EXITED and rec.exit_code == 0
    assert rec.output_tail == b"finished\n"
    assert (await space.exec_record("k:run@3")).state == ExecState.LOST
    assert await space.current_epoch() == 3
    again = await space.exec(["bash", "-c", "echo finished"], key="k:done@3", epoch=3)
    assert again.replayed and again.output == b"finished\n"


async def test_port_and_instance_stable_across_restart_and_driver_restart(
    backend: DockerBackend,
) -> None:
    name = _name()
    space = await backend.create(name)
    port, instance = space.port, space.instance_id
    assert (backend._home(name) / "port").read_text() == str(port)
    await space.write_file("keep.txt", b"kept", epoch=1)
    await backend.restart(name)
    c = backend.engine().containers.get(space.container_id)
    assert backend._published_port(c) == port
    # A new driver: a fresh backend object on the same state dir finds the same Space.
    fresh = DockerBackend(backend.state_dir, image=backend.image)
    try:
        found = await fresh.find(name)
        assert found is not None
        assert found.port == port and found.instance_id == instance
        assert await found.read_file("keep.txt") == b"kept"
        assert await fresh.create(name) is found  # create is idempotent
    finally:
        await fresh.close()


async def test_removal_then_gone_and_new_instance(backend: DockerBackend) -> None:
    name = _name()
    space = await backend.create(name)
    await space.exec(["bash", "-c", "echo a > a.txt"], key="k:a@1", epoch=1)
    await space.advance_epoch(2)
    await backend.delete(name)
    assert await backend.find(name) is None
    assert name not in await backend.names()
    with pytest.raises(SpaceGoneError):
        await space.read_file("a.txt")
    with pytest.raises(SpaceGoneError):
        await backend.restart(name)
    await backend.delete(name)  # missing is not an error
    new = await backend.create(name)
    assert new.instance_id != space.instance_id
    assert await new.list_dir(".") == []
    assert (await new.exec_record("k:a@1")).state == ExecState.UNKNOWN
    assert await new.current_epoch() == 0


async def test_kill_daemon_restarts_it_and_epoch_raise_sweeps_orphans(
    backend: DockerBackend,
) -> None:
    """supervise starts a new daemon; the command survives as an orphan (LOST in the
    ledger) until the floor rises, when the docker Space kills it."""
    name = _name()
    space = await backend.create(name)
    await space.spawn(
        ["bash", "-c", "while true; do echo x >> loop; sleep 0.05; done"], key="k:loop@1", epoch=1
    )
    for _ in range(100):
        if await _size(space, "loop") > 0:
            break
        await asyncio.sleep(0.05)
    c = backend.engine().containers.get(space.container_id)
    old_daemon = backend._daemon_pid(c)
    await backend.kill_daemon(name)
    c.reload()
    assert c.status == "running"
    assert backend._daemon_pid(c) not in (None, old_daemon)
    assert (await space.exec_record("k:loop@1")).state == ExecState.LOST
    size = await _size(space, "loop")
    await asyncio.sleep(0.3)
    assert await _size(space, "loop") > size  # the orphan still writes: documented
    await space.advance_epoch(2)
    size = await _size(space, "loop")
    await asyncio.sleep(0.3)
    assert await _size(space, "loop") == size
    assert "while true" not in await _ps(space)
    # The new daemon serves commands under the new floor.
    res = await space.exec(["echo", "ok"], key="k:after@2", epoch=2)
    assert res.output == b"ok\n"


async def test_epoch_raise_sweeps_background_leftovers_only_when_it_rises(
    backend: DockerBackend,
) -> None:
    space = await backend.create(_name())
    await space.advance_epoch(1)
    await space.exec(["bash", "-c", "sleep 301 >/dev/null 2>&1 &"], key="k:bg@1", epoch=1)
    await space.advance_epoch(1)  # equal: a no-op, the leftover stays
    assert "sleep 301" in await _ps(space)
    await space.advance_epoch(2)
    assert "sleep 301" not in await _ps(space)


async def test_orphans_are_reaped_by_pid1(backend: DockerBackend) -> None:
    """supervise as pid 1 reaps orphans (plain ``serve`` as pid 1 left zombies)."""
    space = await backend.create(_name())
    for _ in range(3):
        await space.exec(["bash", "-c", "(sleep 0.1 &); sleep 0.05 & exit 0"], key=None, epoch=0)
    await asyncio.sleep(0.8)
    res = await space.exec(["ps", "-eo", "stat="], key=None, epoch=0)
    states = res.output.decode().split()
    assert states and not any(s.startswith("Z") for s in states)


async def test_waiting_for_a_daemon_stops_when_its_container_is_removed(
    backend: DockerBackend,
) -> None:
    """A removal racing a restart: the wait for the restarted daemon gives up as soon as
    the container is gone, instead of waiting out the whole boot timeout (it held a
    campaign's next attempt for 30 s)."""
    name = _name()
    await backend.create(name)
    c = await asyncio.to_thread(backend._container, name)
    assert c is not None
    await asyncio.to_thread(c.remove, force=True)
    with pytest.raises(SpaceUnavailableError, match="removed"):
        await backend._await_daemon(c)


async def test_waiting_for_a_daemon_waits_out_a_restart_by_someone_else(
    backend: DockerBackend,
) -> None:
    """A stopped container is not a removed one: a check that finds the container while a
    restart kills and starts it waits for the new daemon (an eager give-up ended a
    campaign run as an error)."""
    name = _name()
    await backend.create(name)
    c = await asyncio.to_thread(backend._container, name)
    assert c is not None
    await asyncio.to_thread(c.kill)

    async def start_later() -> None:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(c.start)

    starter = asyncio.create_task(start_later())
    assert await backend._await_daemon(c) > 0.5
    await starter


async def test_a_token_rotation_takes_a_floor_past_the_grant_back_to_it(
    backend: DockerBackend,
) -> None:
    """A superseded holder advanced the Space to 10^15 before the host rotated the token
    for the next lease (durable_spaces/cluster/host.py): the container comes back on the
    grant's floor with the new token only, and the grant's holder goes on; a floor within
    the grant stays where it is."""
    name = _name()
    old = await backend.create(name)
    await old.advance_epoch(10**15)
    token = await backend.rotate_token(name, 7)
    fresh = await backend.find(name)
    assert fresh is not None and fresh._token == token
    assert await fresh.current_epoch() == 7
    await fresh.advance_epoch(8)
    await backend.rotate_token(name, 9)  # within the grant: nothing taken back
    again = await backend.find(name)
    assert again is not None and await again.current_epoch() == 8
    old.disconnect()
    with pytest.raises(SpaceUnavailableError):
        await old.current_epoch()
