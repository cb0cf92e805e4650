"""The checker's raw reads of real Spaces: the workspace (a host walk on local and
spacesd, a tar streamed out of the Space elsewhere) and what still runs in it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from checker_scenes import dump, scene
from needs import need

from durable_spaces.backends import open_backend
from durable_spaces.campaigns.checks import processes
from durable_spaces.campaigns.checks.workspace import snapshot, stream_tar

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("spacesd", marks=pytest.mark.spacesd, id="spacesd"),
    pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.slow], id="docker"),
]

TREE = (
    "mkdir empty && printf 'a\\000b' > a && chmod 640 a && ln -s ../nowhere link && "
    "mkfifo pipe && mkdir d && printf x > d/x && "
    "if command -v python3 >/dev/null; then python3 -c "
    "\"import socket; s = socket.socket(socket.AF_UNIX); s.bind('sock')\"; fi"
)


def _need(backend: str) -> None:
    need(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_workspace_and_leftover_processes_of_a_real_space(tmp_path: Path, backend: str) -> None:
    _need(backend)

    async def go() -> None:
        b = open_backend(backend, tmp_path / "spaces")
        try:
            space = await b.create("ck-raw")
            await space.advance_epoch(1)
            res = await space.exec(["sh", "-c", TREE], key=None, epoch=1)
            assert res.exit_code == 0, res.output
            await space.write_file("w.txt", b"w\n", epoch=1)  # through the daemon (its helpers run)
            has_socket = (
                await space.exec(["sh", "-c", "test -S sock"], key=None, epoch=1)
            ).exit_code == 0
            ws = await snapshot(space)
            kinds = {p: n.kind for p, n in ws.nodes.items()}
            want = {".": "dir", "empty": "dir", "a": "file", "link": "symlink", "pipe": "fifo",
                    "d": "dir", "d/x": "file", "w.txt": "file"}  # fmt: skip
            if has_socket:
                want["sock"] = "socket"
            assert kinds == want
            assert ws.nodes["a"].data == b"a\0b" and ws.nodes["a"].mode == 0o640
            assert ws.nodes["link"].target == "../nowhere"
            assert ws.fine_times and all(n.ctime_ns for p, n in ws.nodes.items() if p != "sock")
            tarred = await stream_tar(space)  # the docker/microvm path, on any backend
            assert {p: n.kind for p, n in tarred.nodes.items()} == want
            assert tarred.nodes["a"] == ws.nodes["a"]

            none = await processes.list_processes(space, set(), server=False)
            assert none.unknown is None and processes.leftovers(none, server=False) == []
            res = await space.exec(["sh", "-c", "sleep 120 >/dev/null 2>&1 &"], key=None, epoch=1)
            assert res.exit_code == 0
            listing = await processes.list_processes(space, set(), server=False)
            left = processes.leftovers(listing, server=False)
            assert [p.cmd.split()[:2] for p in left] == [["sleep", "120"]], dump(listing)
        finally:
            for name in await b.names():
                await b.delete(name)
            await b.close()

    asyncio.run(go())


def test_a_leftover_process_is_a_resurrected_process(tmp_path: Path) -> None:
    """The whole check on a real local Space: a command of a call still running after
    the run is reported with its call and pid as witness."""
    s = scene(tmp_path / "run")

    async def go() -> None:
        b = open_backend("local", tmp_path / "spaces")
        try:
            space = await b.create("ck-proc")
            await space.advance_epoch(1)
            command = "sleep 120 && printf '%s\\n' 's9-99999999' >> journal.txt"
            s.t.call("call-s9-99999999", "bash", {"command": command}, status="interrupted")
            await space.exec(["sh", "-c", f"{command} >/dev/null 2>&1 &"], key=None, epoch=1)
            inputs = s.inputs()
            inputs.processes = await processes.list_processes(space, set(), server=False)
            v = processes.no_leftover_processes(inputs)
            assert v["valid"] is False, dump(v)
            a = v["anomalies"][0]
            assert a["name"] == "resurrected_process"
            assert a["witness"][0] == "call-s9-99999999" and isinstance(a["witness"][1], int)
        finally:
            for name in await b.names():
                await b.delete(name)
            await b.close()

    asyncio.run(go())
