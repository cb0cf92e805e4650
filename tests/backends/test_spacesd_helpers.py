"""The spacesd Space's helper commands (the daemon-side scan's ``find`` and ``xargs
sha256sum``, ``read_files``' ``tar``, the change journal's ``perl``) run under the epoch
the Space was last advanced to, so a helper its driver's death left waiting (an ``xargs``
never fed its stdin, a journal never asked again) is killed by the successor's advance.
Under epoch 0 it outlived every advance: the campaigns' ``resurrected_process``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from durable_spaces.backends.spacesd.backend import SpacesdBackend
from durable_spaces.backends.spacesd.scan import HASH_ARGV

pytestmark = [pytest.mark.spacesd]  # skipped without cua-spacesd (tests/needs.py)

#: A driver that advances the Space to epoch 1 and dies (SIGKILL) in its scan, after the
#: hash helper started and before it was fed its stdin.
DRIVER = r"""
import asyncio, os, signal, sys
from durable_spaces.backends.spacesd.backend import SpacesdBackend
from durable_spaces.backends.spacesd.spacesd_space import SpacesdSpace

async def die(self, ex, data):
    os.kill(os.getpid(), signal.SIGKILL)

async def main():
    space = await SpacesdBackend(sys.argv[1]).find("helper")
    await space.advance_epoch(1)
    if sys.argv[2] == "journal":  # the journal's helper started and answered: die after
        await SpacesdSpace.scan(space)
        os.kill(os.getpid(), signal.SIGKILL)
    space._guest.unavailable = "this driver's scan is find's"
    SpacesdSpace._feed = die
    await SpacesdSpace.scan(space)  # the daemon's scan (this host's would not need one)

asyncio.run(main())
"""


def _waiting_helpers(root: str, argv: list[str] = list(HASH_ARGV)) -> list[int]:  # noqa: B006
    out = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        cmdline = p.info["cmdline"] or []
        # the hash helper runs in the workspace; the journal's runs from / and names it
        if (
            (p.info["cwd"] == root or root in cmdline[len(argv) :])
            and cmdline[: len(argv)] == argv
            and p.info["status"] != psutil.STATUS_ZOMBIE
        ):
            out.append(p.pid)
    return out


@pytest.mark.parametrize("helper", ["hash", "journal"])
async def test_a_helper_left_by_a_dead_driver_dies_with_the_next_epoch(
    tmp_path: Path, helper: str
) -> None:
    backend = SpacesdBackend(tmp_path / "spaces")
    try:
        await _left_helper_is_killed(backend, tmp_path, helper)
    finally:
        await backend.delete("helper")
        await backend.close()


async def _left_helper_is_killed(backend: SpacesdBackend, tmp_path: Path, helper: str) -> None:
    space = await backend.create("helper")
    await space.write_file("a.txt", b"to hash", epoch=1)
    r = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", DRIVER, str(tmp_path / "spaces"), helper],
        env={**os.environ, "DS_HOST_SCAN": "0"},
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == -9, r.stderr.decode()[-2000:]
    argv = list(HASH_ARGV) if helper == "hash" else ["perl", "-e"]
    assert _waiting_helpers(space.root, argv)  # left waiting for its stdin by the dead driver
    await space.advance_epoch(2)  # the successor
    for _ in range(100):
        if not _waiting_helpers(space.root, argv):
            break
        await asyncio.sleep(0.05)
    assert _waiting_helpers(space.root, argv) == []
