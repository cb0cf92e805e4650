"""The spacesd daemon's token rotated while it runs (``--await-token-file``), and its
epoch floor taken back to a grant it was raised past (the cluster's
host rotates a Space's token for every lease, durable_spaces/cluster/host.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from durable_spaces.backends.spacesd import SpacesdBackend, unavailable_reason
from durable_spaces.errors import SpaceUnavailableError


def test_a_daemon_floor_past_the_grant_is_taken_back_and_the_old_token_refused(
    tmp_path: Path,
) -> None:
    if (why := unavailable_reason()) is not None:
        pytest.skip(why)

    async def main() -> None:
        backend = SpacesdBackend(tmp_path)
        try:
            space = await backend.create("sp")
            old = backend._daemon("sp").token()
            await space.advance_epoch(10**15)  # a holder wedging the Space for its successors
            boot = space._probe.boot_id()
            token = await backend.rotate_token("sp", 7)
            assert token != old and backend._daemon("sp").floor() == 7
            fresh = await backend.find("sp")
            assert fresh is not None and await fresh.current_epoch() == 7
            assert fresh._probe.boot_id() != boot  # restarted on the floor it was granted
            await fresh.advance_epoch(8)  # the grant's holder goes on
            # Within the grant: the daemon keeps running, only its token changes.
            boot = fresh._probe.boot_id()
            await backend.rotate_token("sp", 8)
            again = await backend.find("sp")
            assert again is not None and again._probe.boot_id() == boot
            assert await again.current_epoch() == 8
            space.disconnect()  # the first object still holds the first token
            with pytest.raises(SpaceUnavailableError, match="invalid bearer token"):
                await space.current_epoch()
        finally:
            await backend.delete("sp")
            await backend.close()

    asyncio.run(main())


def test_a_daemon_that_does_not_watch_its_token_file_is_restarted_on_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon started by older code took its token from the environment once: the
    rotation waits for it as long as a start may take, then restarts it."""
    if (why := unavailable_reason()) is not None:
        pytest.skip(why)
    from durable_spaces.backends.spacesd import daemon

    real = daemon.subprocess.Popen

    def old_style(argv: list[str], **kw: Any) -> Any:
        if "--await-token-file" not in argv:  # the binary's own checks
            return real(argv, **kw)
        at = argv.index("--await-token-file")
        token_file = argv[at + 2]
        argv = argv[:at] + argv[at + 5 :]  # the flag, --token-file F, --token-poll-ms N
        kw["env"] = {**kw["env"], "CUA_ENV_TOKEN": Path(token_file).read_text()}
        return real(argv, **kw)

    async def main() -> None:
        backend = SpacesdBackend(tmp_path, start_timeout=3.0)
        try:
            with monkeypatch.context() as m:
                m.setattr(daemon.subprocess, "Popen", old_style)
                space = await backend.create("sp")
            boot = space._probe.boot_id()
            token = await backend.rotate_token("sp", None)
            fresh = await backend.find("sp")
            assert fresh is not None and fresh._probe.boot_id() != boot  # restarted
            assert fresh._token == token and await fresh.current_epoch() == 0
        finally:
            await backend.delete("sp")
            await backend.close()

    asyncio.run(main())


def test_a_floor_raised_by_the_old_token_while_the_new_one_is_taken_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of a superseded holder: its ``AdvanceEpoch(10^15)`` lands after the
    rotation looked at the floor and before the daemon took the new token (its poll
    window). The window is held open by an event: the advance runs, and completes,
    inside the rotation's token write, before the file changes. The rotation must still
    return a Space on the grant's floor, which the new holder can advance."""
    if (why := unavailable_reason()) is not None:
        pytest.skip(why)
    from durable_spaces.backends.spacesd import daemon

    async def main() -> None:
        backend = SpacesdBackend(tmp_path)
        loop = asyncio.get_running_loop()
        try:
            old_holder = await backend.create("sp")
            await old_holder.advance_epoch(6)
            real = daemon.LocalDaemon.rotate_token
            raced: list[int] = []

            def write_after_the_old_holder_raised(d: daemon.LocalDaemon) -> str:
                wedge = asyncio.run_coroutine_threadsafe(old_holder.advance_epoch(10**15), loop)
                wedge.result()  # accepted: the old token is still the daemon's
                raced.append(d.floor())
                return real(d)

            monkeypatch.setattr(
                daemon.LocalDaemon, "rotate_token", write_after_the_old_holder_raised
            )
            await backend.rotate_token("sp", 7)
            assert raced == [10**15]  # the race happened
            fresh = await backend.find("sp")
            assert fresh is not None and await fresh.current_epoch() == 7
            await fresh.advance_epoch(8)  # the grant's holder is not fenced
            assert backend._daemon("sp").floor() == 8
            old_holder.disconnect()
            with pytest.raises(SpaceUnavailableError, match="invalid bearer token"):
                await old_holder.current_epoch()
        finally:
            await backend.delete("sp")
            await backend.close()

    asyncio.run(main())
