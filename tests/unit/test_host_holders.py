"""``host_holders.Holders``: which files of a filesystem some process holds, read from
``/proc`` (real child processes, real mappings). A file stored through a shared mapping
must show while the mapping lives, with or without its descriptor, even mprotect-ed
read-only; a file nobody holds must not; a process that turns unreadable makes the look
untrusted (None); ``hidepid`` makes every look untrusted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_spaces import host_holders
from durable_spaces.host_holders import Holders

#: Opens argv[1], maps it shared, then does what stdin says, line by line, acking each.
_HOLDER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
size = os.stat(sys.argv[1]).st_size
fd = os.open(sys.argv[1], os.O_RDWR)
# libc's mmap, not Python's: Python's mmap object keeps a descriptor of its own.
addr = libc.mmap(None, size, 3, 1, fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
assert addr not in (None, ctypes.c_void_p(-1).value)
ctypes.memmove(addr, b"STORE", 5)
print("ready", flush=True)
for cmd in sys.stdin:
    cmd = cmd.strip()
    if cmd == "close-fd":
        os.close(fd)
    elif cmd == "read-only":
        assert libc.mprotect(addr, size, 1) == 0  # PROT_READ
    elif cmd == "unmap":
        assert libc.munmap(addr, size) == 0
    print("done", flush=True)
"""


class Holder:
    def __init__(self, path: Path) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.p.stdout is not None and self.p.stdout.readline() == "ready\n"

    def do(self, cmd: str) -> None:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline() == "done\n"

    def end(self) -> None:
        self.p.kill()
        self.p.wait()


@pytest.fixture
def file(tmp_path: Path) -> Iterator[Path]:
    f = tmp_path / "mapped.bin"
    f.write_bytes(b"x" * 8192)
    yield f


def test_a_mapped_file_is_held_until_its_mapping_and_descriptor_go(file: Path) -> None:
    holders = Holders(os.stat(file).st_dev)
    assert holders.problem is None
    ino = os.stat(file).st_ino
    assert ino not in (holders.now() or set())
    h = Holder(file)
    try:
        assert ino in (holders.now() or set())  # mapped, and open
        h.do("close-fd")
        assert ino in (holders.now() or set())  # the mapping alone
        h.do("read-only")
        assert ino in (holders.now() or set())  # written before, maybe: still held
        h.do("unmap")
        assert ino not in (holders.now() or set())  # neither a mapping nor a descriptor
    finally:
        h.end()


def test_an_open_descriptor_alone_holds_the_file(file: Path) -> None:
    holders = Holders(os.stat(file).st_dev)
    ino = os.stat(file).st_ino
    with open(file, "rb"):
        assert ino in (holders.now() or set())
    assert ino not in (holders.now() or set())


def test_a_process_that_turns_unreadable_makes_the_look_untrusted(
    file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holders = Holders(os.stat(file).st_dev)
    assert holders.now() is not None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    real = host_holders._fds

    def blind_child(base: str, dev: int, held: set[int]) -> None:
        if base == f"/proc/{child.pid}":
            raise PermissionError(13, "Permission denied")
        real(base, dev, held)

    try:
        monkeypatch.setattr(host_holders, "_fds", blind_child)
        assert holders.now() is None  # it was readable when the holders were made
        fresh = Holders(os.stat(file).st_dev)
        assert fresh.now() is not None  # blind from the start: trusted like the rest
    finally:
        child.kill()
        child.wait()
    assert holders.now() is not None  # gone: nothing of it to fear


def test_proc_mounted_with_hidepid_is_untrusted_unless_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    line = b"22 27 0:21 / /proc rw,relatime - proc proc rw,hidepid=invisible\n"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "hidepid" in (host_holders._hidden(line) or "")
    assert host_holders._hidden(line.replace(b"hidepid=invisible", b"hidepid=0")) is None
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert host_holders._hidden(line) is None


#: Maps argv[1] shared, closes it, and leaves a thread storing through the mapping
#: while the main thread exits: the process then shows no maps or fds of its own.
_LEADER_C = r"""
#include <pthread.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static char *m;
static void *run(void *a) {
  char buf[8];
  memcpy(m, "STORE", 5); printf("stored\n"); fflush(stdout);
  read(0, buf, sizeof buf);
  return 0;
}
int main(int c, char **v) {
  int fd = open(v[1], O_RDWR);
  m = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  pthread_t t;
  pthread_create(&t, 0, run, 0);
  pthread_exit(0);
}
"""


def test_a_mapping_is_held_after_the_main_thread_exits(file: Path, tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc or gcc) to build the helper whose main thread exits")
    src, exe = tmp_path / "leader.c", tmp_path / "leader"
    src.write_text(_LEADER_C)
    subprocess.run([cc, "-pthread", "-o", str(exe), str(src)], check=True)
    holders = Holders(os.stat(file).st_dev)
    ino = os.stat(file).st_ino
    p = subprocess.Popen([str(exe), str(file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"stored\n"
        # The thread may store before the main thread is done exiting: wait for it.
        deadline = time.monotonic() + 10
        while os.listdir(f"/proc/{p.pid}/fd") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.listdir(f"/proc/{p.pid}/fd") == []  # nothing of its own to see
        assert ino in (holders.now() or set())  # its thread's view holds the mapping
    finally:
        p.kill()
        p.wait()


def _kernel_threads() -> list[str]:
    out = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            data = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if int(fields[6]) & host_holders._PF_KTHREAD:
            out.append(pid)
    return out


def test_kernel_threads_are_known_after_one_look_and_skipped(file: Path) -> None:
    kthreads = _kernel_threads()
    if not kthreads:
        pytest.skip("this PID namespace shows no kernel threads")
    assert Holders(os.stat(file).st_dev).now() is not None
    known = [p for p in kthreads if host_holders._KERNEL.known(p)]
    # Each one found is kept (up to the limit), so the next look skips it.
    assert len(known) >= min(len(kthreads), host_holders._Kernel.LIMIT) - 2  # some may exit


def test_a_user_process_is_never_taken_for_a_kernel_thread_nor_kept_once_gone() -> None:
    kernel = host_holders._Kernel()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not kernel.learn(str(child.pid))  # its flags say it is a user process
        # As if it were one (a kernel thread whose pid a new process took): the
        # directory opened for the old one fails once it is gone.
        kernel._fds[str(child.pid)] = os.open(f"/proc/{child.pid}", os.O_RDONLY)
        assert kernel.known(str(child.pid))
    finally:
        child.kill()
        child.wait()
    assert not kernel.known(str(child.pid))
    assert str(child.pid) not in kernel._fds


def test_a_descriptor_a_cache_let_go_during_the_look_is_looked_at(
    file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process's own caches' descriptors are skipped only when a cache held them
    before and after the look: one let go meanwhile may be a new file already."""
    holders = Holders(os.stat(file).st_dev)
    ino = os.stat(file).st_ino
    fd = os.open(file, os.O_RDONLY)
    try:
        calls: list[int] = []

        def cache() -> list[int]:  # holds ``fd`` at the first ask, not at the second
            calls.append(fd)
            return [fd] if len(calls) % 2 == 1 else []

        monkeypatch.setattr(host_holders, "_NOT_WORKSPACE", [cache])
        assert ino in (holders.now() or set())  # let go during the look: looked at
        monkeypatch.setattr(host_holders, "_NOT_WORKSPACE", [lambda: [fd]])
        assert ino not in (holders.now() or set())  # a cache's throughout: skipped
    finally:
        os.close(fd)
