"""A command of a ``local`` Space cannot leave its epoch, even as root
(``durable_spaces/backends/local/confine.py``, the fork server's checks in
``forkserver.py``): not through the Space's own fork server, not by writing its pid into
another cgroup (the hierarchy's root, a sibling it made, the next epoch's), not by being
cloned into one; and whatever cgroup an old epoch's command made (a host without the
fence) dies with the advance. Each attack leaves a process that writes its pid, waits for
``go`` and then writes ``late.txt``: after ``advance_epoch(2)`` returned it must be dead.
CI runs these as root, the case that matters (the hierarchy is root's)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from durable_spaces.backends.local import confine
from durable_spaces.backends.local.backend import LocalBackend, LocalSpace
from durable_spaces.backends.local.forkserver import SOCK, request
from durable_spaces.backends.local.supervisor import format_spec
from durable_spaces.space import CONTAINED_EPOCHS
from tests.backends import test_local_cgroups

needs_cgroup = pytest.mark.cgroup  # tests/needs.py: a skip outside CI, a failure on CI
backend = test_local_cgroups.backend  # the same fixture

#: The process an attack leaves: says its pid, waits for ``go``, then writes late.txt.
_LATE = (
    "echo $$ > pid.tmp; mv pid.tmp pid.txt;"
    " while [ ! -e go ]; do sleep 0.01; done; echo late > late.txt"
)
#: An attack's command ends once what it left said its pid.
_UNTIL_LEFT = "while [ ! -e pid.txt ]; do sleep 0.01; done"

#: A command that asks the Space's fork server for a supervisor of its own and hands it
#: ``_LATE``; it ends when that runs (pid.txt) or when the server or its child said no.
_ASK_THE_SERVER = r"""
import os, select, socket, sys
sock, req, spec = sys.argv[1], bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
os.makedirs("evil", exist_ok=True)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sock)
s.sendall(req)
reply = s.recv(32)
if not reply:
    sys.exit("refused by the server")
pidfd = os.pidfd_open(int(reply))
s.sendall(spec)
s.shutdown(socket.SHUT_WR)
while not os.path.exists("pid.txt"):
    if select.select([pidfd], [], [], 0.01)[0]:
        sys.exit("its child ran nothing")
"""

#: A command cloned straight into the cgroup ``argv[1]`` (``CLONE_INTO_CGROUP``).
_CLONE_INTO = r"""
import ctypes, os, struct, sys
fd = os.open(sys.argv[1], os.O_PATH | os.O_DIRECTORY)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
args = struct.pack("11Q", 0x200000000, 0, 0, 0, 17, 0, 0, 0, 0, 0, fd)
pid = libc.syscall(435, ctypes.create_string_buffer(args), len(args))
if pid == 0:
    os.execvp("sh", ["sh", "-c", sys.argv[2]])
if pid < 0:
    sys.exit("clone3: " + os.strerror(ctypes.get_errno()))
while not os.path.exists("pid.txt"):
    os.sched_yield()
"""


def _exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


def _mount_of(path: Path) -> Path:
    """The cgroup2 mount ``path`` is under."""
    for mount in confine.cgroup_mounts(Path("/proc/self/mountinfo").read_text()):
        if path.is_relative_to(mount) and (Path(mount) / "cgroup.procs").exists():
            return Path(mount)
    raise AssertionError(f"{path} is under no cgroup2 mount")


async def _outlives(space: LocalSpace, argv: list[str]) -> str:
    """What the attack ``argv`` (a command of epoch 1) left running after the advance to
    2: "" when nothing (what must hold), else what."""
    r = await space.exec(argv, key="attack@1", epoch=1)
    pid_file = Path(space.root) / "pid.txt"
    pidfd = os.pidfd_open(int(pid_file.read_text())) if pid_file.exists() else None
    try:
        await space.advance_epoch(2)
        (Path(space.root) / "go").write_text("")
        if pidfd is not None and not _exited(pidfd):
            return f"a process of epoch 1 runs after the advance to 2 ({r.output!r})"
        assert not (Path(space.root) / "late.txt").exists()
        return ""
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _target(space: LocalSpace, which: str) -> Path:
    assert space.cgroups.dir is not None
    return {
        "the hierarchy's root": _mount_of(space.cgroups.dir),
        "a sibling it made": space.cgroups.dir / "e999",
        "the next epoch's": space.cgroups.dir / "e2",
    }[which]


@needs_cgroup
@pytest.mark.parametrize("supervisor", ["forkserver", "direct"])
@pytest.mark.parametrize("which", ["the hierarchy's root", "a sibling it made", "the next epoch's"])
async def test_a_command_cannot_move_into_another_cgroup(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch, supervisor: str, which: str
) -> None:
    monkeypatch.setenv("DS_LOCAL_FORKSERVER", "1" if supervisor == "forkserver" else "0")
    space = await backend.create("loc")
    assert CONTAINED_EPOCHS in (await space.capabilities()).features
    await space.advance_epoch(1)
    target = _target(space, which)
    moved = f"mkdir -p {target}; echo $$ > {target}/cgroup.procs"
    # out of its group and without the Space's mark too: the cgroup is all that is left
    script = f"setsid env -i sh -c '{moved}; {_LATE}' & {_UNTIL_LEFT}"
    assert await _outlives(space, ["sh", "-c", script]) == ""


@needs_cgroup
async def test_a_command_cannot_have_the_fork_server_start_one_for_it(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's socket is within reach of every command (same uid, same host): a
    command that asks must get nothing that runs."""
    monkeypatch.setenv("DS_LOCAL_FORKSERVER", "1")
    space = await backend.create("loc")
    await space.advance_epoch(1)
    await space.exec(["true"], key="start@1", epoch=1)  # the server is up
    work = Path(space.root)
    (work / "ask.py").write_text(_ASK_THE_SERVER)
    req = request(str(work / "evil"))
    spec = format_spec(str(work), ["sh", "-c", _LATE], {"PATH": os.environ["PATH"]})
    argv = [sys.executable, "ask.py", str(work.parent / SOCK), req.hex(), spec.hex()]
    assert await _outlives(space, argv) == ""


@needs_cgroup
async def test_a_command_cannot_be_cloned_into_another_cgroup(backend: LocalBackend) -> None:
    """``clone3(CLONE_INTO_CGROUP)`` with an ``O_PATH`` descriptor of the root: no file
    of cgroupfs is written, so Landlock alone lets it through; seccomp does not."""
    space = await backend.create("loc")
    await space.advance_epoch(1)
    assert space.cgroups.dir is not None
    (Path(space.root) / "clone.py").write_text(_CLONE_INTO)
    argv = [sys.executable, "clone.py", str(_mount_of(space.cgroups.dir)), _LATE]
    assert await _outlives(space, argv) == ""
    r = await space.exec_record("attack@1")
    assert r.exit_code == 1 and b"clone3: Function not implemented" in r.output_tail
    # and a command's own children still start (libc falls back to clone)
    r2 = await space.exec(["sh", "-c", "echo $(echo nested)"], key="fork@2", epoch=2)
    assert r2.output == b"nested\n"


@needs_cgroup
async def test_a_command_cannot_go_back_to_the_hosts_namespaces(backend: LocalBackend) -> None:
    """Root's ways out of a namespace (``nsenter`` by ``/proc/1/ns``, a new mount of
    cgroupfs, ``/proc/1/root``) are closed by Landlock whatever the capabilities."""
    space = await backend.create("loc")
    await space.advance_epoch(1)
    assert space.cgroups.dir is not None
    root = _mount_of(space.cgroups.dir)
    tries = {
        "nsenter": f"nsenter -t 1 -m -C sh -c 'echo $$ > {root}/cgroup.procs'",
        "mount": "mkdir -p m && unshare -m mount -t cgroup2 none m",  # gone with it
        "proc-root": f"echo $$ > /proc/1/root{root}/cgroup.procs",
    }
    for name, line in tries.items():
        r = await space.exec(["sh", "-c", line], key=f"{name}@1", epoch=1)
        assert r.exit_code != 0, (name, r.output)


@needs_cgroup
async def test_an_advance_kills_every_cgroup_the_old_epoch_made(backend: LocalBackend) -> None:
    """A host without the fence, or a hole in it: cgroups made beside the epochs' (one
    named as a later epoch's too) and below one, each with a process, are killed with the
    old epoch and removed; the new epoch's own cgroup is kept."""
    space = await backend.create("loc")
    await space.advance_epoch(1)
    await space.exec(["true"], key="k@1", epoch=1)
    d = space.cgroups.dir
    assert d is not None
    made = [d / "x", d / "e999", d / "e1" / "nested"]
    sleepers = []
    for cg in made:
        cg.mkdir()
        p = subprocess.Popen(["sleep", "1000"])
        (cg / "cgroup.procs").write_text(f"{p.pid}\n")
        sleepers.append(p)
    try:
        await space.advance_epoch(2)
        assert [p.poll() is not None for p in sleepers] == [True] * len(made)
        assert [cg.exists() for cg in made] == [False] * len(made)
        await space.exec(["true"], key="k@2", epoch=2)
        await space.advance_epoch(2)  # the same floor: its own cgroup stays
        assert (d / "e2").exists()
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


async def test_a_host_without_the_fence_says_so(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Landlock (or another machine): the Space keeps its cgroups but does not claim
    its epochs contained, and says why."""
    monkeypatch.setattr(confine, "_why", ["commands could leave their epoch's cgroup: test"])
    space = await backend.create("loc")
    caps = await space.capabilities()
    assert CONTAINED_EPOCHS not in caps.features
    assert "could leave their epoch's cgroup" in caps.missing[CONTAINED_EPOCHS]
    assert space.cgroups.fenced_as == ""


def test_the_grants_leave_out_exactly_the_cgroup_mounts(tmp_path: Path) -> None:
    for d in ("a/b/cg", "a/b/other", "a/c", "d", "cg2"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "f").write_text("")
    blocked = [str(tmp_path / "a/b/cg"), str(tmp_path / "cg2")]
    got = sorted(os.path.relpath(p, tmp_path) for p in confine.granted(blocked, str(tmp_path)))
    assert got == ["a/b/other", "a/c", "d", "f"]
    mountinfo = (
        "41 31 0:38 / /sys/fs/cgroup/a\\040b rw - cgroup2 cgroup2 rw\n"
        "42 31 0:39 / /x rw - tmpfs tmpfs rw\n43 31 0:40 / /v1 rw - cgroup cgroup rw,cpu\n"
    )
    assert confine.cgroup_mounts(mountinfo) == ["/sys/fs/cgroup/a b", "/v1"]
