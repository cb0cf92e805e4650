"""The look for processes a call left in the workspace (``adapter/leftovers.py``): the
command run in a Space and the look done on this host find the same processes and
held files, and what the Space answers is checked before it names a path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from durable_spaces.adapter.leftovers import Leftovers, host_look, look, parse, script
from durable_spaces.backends import open_backend, unavailable_reason
from durable_spaces.space import HostProcesses

HOLDER = (
    "import mmap, sys, time\n"
    "f = open('../m.bin', 'r+b'); m = mmap.mmap(f.fileno(), 4); f.close()\n"
    "g = open('held file', 'rb')\n"
    "r = open('../readonly.bin', 'rb'); ro = mmap.mmap(r.fileno(), 4, prot=mmap.PROT_READ)\n"
    "r.close()\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_the_command_and_the_host_look_agree(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "m.bin").write_bytes(b"aaaa")
    (ws / "readonly.bin").write_bytes(b"rrrr")
    (ws / "sub" / "held file").write_bytes(b"h")
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        cwd=ws / "sub",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        out = subprocess.run(["bash", "-c", script(str(ws))], cwd="/", capture_output=True)
        in_space = parse(str(ws), out.stdout)
        here = host_look(str(ws))
        assert in_space == here
        assert here.pids == (p.pid,)
        # Its open file and its mappings (Python's mmap keeps a copy of the descriptor).
        assert here.held == {"m.bin", "readonly.bin", "sub/held file"}
    finally:
        p.kill()
        p.wait()
    assert host_look(str(ws)) == Leftovers()


LOOKER = (
    "import subprocess, sys\n"
    "from durable_spaces.adapter.leftovers import host_look\n"
    "child = subprocess.Popen(['sleep', '30'])\n"
    "try:\n"
    "    print(child.pid, host_look('.').pids, flush=True)\n"
    "finally:\n"
    "    child.kill(); child.wait()\n"
)


def test_the_host_look_leaves_out_the_process_that_runs_it(tmp_path: Path) -> None:
    """An agent whose workspace is its own working directory (an integration's pinned
    one): the look it runs finds the command it started there, not itself."""
    out = subprocess.run(
        [sys.executable, "-c", LOOKER], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    child, pids = out.stdout.split(maxsplit=1)
    assert pids.strip() == f"({child},)"


def test_what_the_space_answers_is_checked() -> None:
    root = "/home/cua/work"
    out = b"\0".join(
        [
            b"P12",
            b"P12",  # once
            b"Pnot-a-pid",
            b"P" + b"9" * 11,  # no pid is that long
            b"F/home/cua/work/a.txt",
            b"F/home/cua/workshop/b.txt",  # another directory
            b"F/etc/passwd",
            b"F/home/cua/work/../escape",
            b"F/home/cua/work/gone.txt (deleted)",
            b"F/home/cua/work",  # the root itself is no file
            b"M/home/cua/work/new\\012line",
            b"M/home/cua/work/d/\xffraw",
            b"Xsomething else",
            b"",
        ]
    )
    got = parse(root, out)
    assert got.pids == (12,)
    assert got.held == {"a.txt", "new\nline", "d/\udcffraw"}
    assert Leftovers().note(auto=False) and not Leftovers()


@pytest.mark.spacesd
async def test_a_daemon_spaces_look_done_here_agrees_with_the_one_run_in_it(
    tmp_path: Path,
) -> None:
    """A ``spacesd`` daemon started on this host (its own PID namespace where the host
    allows one): the look done here (``HostProcesses``) finds what the script run in the
    Space finds, under the pids the Space knows, and leaves out this host's own process
    with its cwd in the workspace (the script in the Space never sees it)."""
    if why := unavailable_reason("spacesd"):
        pytest.skip(f"backend spacesd unavailable: {why}")
    backend = open_backend("spacesd", tmp_path / "spaces")
    outsider = None
    try:
        space = await backend.create("look")
        await space.advance_epoch(1)
        assert isinstance(space, HostProcesses)
        here = space.host_processes()
        assert here is not None
        for rel, data in (("m.bin", b"aaaa"), ("readonly.bin", b"rrrr"), ("sub/held file", b"h")):
            await space.write_file(rel, data, epoch=1)
        run = await space.spawn(
            ["python3", "-c", HOLDER.replace("sys.stdin.read()", "time.sleep(600)")],
            key="holder",
            epoch=1,
            cwd="sub",
        )
        async for chunk in run.output():
            if b"ready" in chunk:
                break
        await run.detach()
        if here:  # a process of this host in the workspace, outside the Space's namespace
            outsider = subprocess.Popen(["sleep", "600"], cwd=space.root)
        res = await space.exec(["bash", "-c", script(space.root)], key=None, epoch=1, cwd="/")
        in_space = parse(space.root, res.output)
        assert len(in_space.pids) == 1
        assert in_space.held == {"m.bin", "readonly.bin", "sub/held file"}
        assert host_look(space.root, here) == in_space
        assert await look(space, 1) == in_space
        await space.advance_epoch(2)  # kills the holder
        assert host_look(space.root, here) == Leftovers()
    finally:
        if outsider is not None:
            outsider.kill()
            outsider.wait()
        for name in await backend.names():
            await backend.delete(name)
        await backend.close()
