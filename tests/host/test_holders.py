"""``host.holders.Holders``: which files of a filesystem some process holds, read from
``/proc`` (real child processes, real mappings). A file stored through a shared mapping
must show while the mapping lives, with or without its descriptor, even mprotect-ed
read-only, at any address; a file nobody holds must not; a process that turns
unreadable makes the look untrusted (None); ``hidepid`` makes every look untrusted.
Every test runs with both sources of the mappings (``host.maps``): the kernel's
``PROCMAP_QUERY`` and the text of ``maps``."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_spaces.host import holders as host_holders
from durable_spaces.host import maps as host_maps
from durable_spaces.host.holders import Holders


def _kernel_answers() -> bool:
    """Whether this kernel answers ``PROCMAP_QUERY`` (Linux 6.11 and later)."""
    saved = host_maps.use_query
    try:
        host_maps.use_query = True
        host_maps.shared_mappings("/proc/self")
        return host_maps.use_query
    finally:
        host_maps.use_query = saved


@pytest.fixture(autouse=True, params=["query", "text"])
def source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The mappings from the kernel's ioctl, or from the text of ``maps``."""
    if request.param == "query" and not _kernel_answers():
        pytest.skip("this kernel has no PROCMAP_QUERY (Linux 6.11+): only the text is read")
    monkeypatch.setattr(host_maps, "use_query", request.param == "query")
    return str(request.param)


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
at = int(sys.argv[2], 16) if len(sys.argv) > 2 else None
# libc's mmap, not Python's: Python's mmap object keeps a descriptor of its own.
# At ``at``: MAP_FIXED_NOREPLACE (0x100000) there.
addr = libc.mmap(at, size, 3, 1 | (0x100000 if at else 0), fd, 0)  # RW, MAP_SHARED
assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
assert at is None or addr == at
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
    def __init__(self, path: Path, at: str | None = None) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path), *([at] if at else [])],
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


def test_a_mapping_at_a_low_address_is_held(file: Path) -> None:
    """``maps`` pads an address below 2**32 to 8 digits, which ``map_files`` refuses as
    a name: the mapping must still be found (it was taken for one unmapped meanwhile)."""
    holders = Holders(os.stat(file).st_dev)
    ino = os.stat(file).st_ino
    h = Holder(file, "200000")  # above vm.mmap_min_addr (64 KiB by default)
    try:
        h.do("close-fd")
        maps = Path(f"/proc/{h.p.pid}/maps").read_text()
        assert "00200000-" in maps  # as maps shows it
        assert ino in (holders.now() or set())
    finally:
        h.end()


def test_both_sources_find_the_same_mappings_of_every_process(file: Path) -> None:
    if not _kernel_answers():
        pytest.skip("this kernel has no PROCMAP_QUERY (Linux 6.11+): nothing to compare")
    h = Holder(file)  # one process with a shared mapping of a file, at least
    try:
        compared = 0
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                host_maps.use_query = True
                by_query = host_maps.shared_mappings(f"/proc/{pid}")
                host_maps.use_query = False
                by_text = host_maps.shared_mappings(f"/proc/{pid}")
            except (PermissionError, FileNotFoundError, ProcessLookupError):
                continue  # another user's, or gone
            if pid == str(h.p.pid):
                assert by_query and (os.stat(file).st_ino in {m[2] for m in by_query})
            if by_query != by_text:  # changed between the two looks? Then not again
                host_maps.use_query = True
                again = host_maps.shared_mappings(f"/proc/{pid}")
                host_maps.use_query = False
                assert again == host_maps.shared_mappings(f"/proc/{pid}"), pid
            compared += 1
        assert compared > 1
    finally:
        h.end()


@pytest.mark.parametrize(
    ("errno_", "for_good"),
    [(25, True), (22, True), (5, False), (12, False)],  # ENOTTY, EINVAL; EIO, ENOMEM
)
def test_an_ioctl_that_fails_reads_the_text_instead(
    file: Path, monkeypatch: pytest.MonkeyPatch, errno_: int, for_good: bool
) -> None:
    """A kernel without the ioctl: the text from then on (asked once). An answer it does
    not expect: the text of that process, that once; the look stays trusted."""
    calls: list[int] = []

    def failing(fd: int, request: int, arg: object = 0, mutate: bool = True) -> None:
        calls.append(request)
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(host_maps.fcntl, "ioctl", failing)
    monkeypatch.setattr(host_maps, "use_query", True)
    holders = Holders(os.stat(file).st_dev)
    ino = os.stat(file).st_ino
    h = Holder(file)
    try:
        h.do("close-fd")
        assert ino in (holders.now() or set())  # found in the text
        assert host_maps.use_query is not for_good
        asked = len(calls)
        assert ino in (holders.now() or set())
        assert (len(calls) == asked == 1) if for_good else len(calls) > asked
    finally:
        h.end()


def test_an_open_descriptor_alone_holds_the_file(file: Path) -> None:
    holders = Holders(os.stat(file).st_dev)
    ino = os.stat(file).st_ino
    with open(file, "rb"):
        assert ino in (holders.now() or set())
    assert ino not in (holders.now() or set())


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_a_process_that_turns_unreadable_makes_the_look_untrusted(
    file: Path, monkeypatch: pytest.MonkeyPatch, lazy: bool
) -> None:
    """Blind from the start (made, or with ``lazy`` its first look): trusted; blind
    only later: nothing is."""
    holders = Holders(os.stat(file).st_dev, lazy=lazy)
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
        fresh = Holders(os.stat(file).st_dev, lazy=lazy)
        assert fresh.now() is not None  # blind from the start: trusted like the rest
        assert fresh.now() is not None
    finally:
        child.kill()
        child.wait()
    assert holders.now() is not None  # gone: nothing of it to fear


def test_lazy_holders_look_first_when_asked(file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``lazy``: no look when made (the checkpoint's journal starts after), one per
    ``now``; the eager kind looks when made."""
    looks: list[int] = []
    real = Holders._look

    def counted(self: Holders) -> object:
        looks.append(1)
        return real(self)

    monkeypatch.setattr(Holders, "_look", counted)
    holders = Holders(os.stat(file).st_dev, lazy=True)
    assert looks == []
    fd = os.open(file, os.O_RDONLY)
    try:
        assert os.stat(file).st_ino in (holders.now() or set())
    finally:
        os.close(fd)
    assert len(looks) == 1
    Holders(os.stat(file).st_dev)
    assert len(looks) == 2


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


def test_prime_finds_the_kernel_threads_before_any_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spare's warm-up (``prime``) leaves the first look nothing to learn of kernel
    threads, and takes no user process for one."""
    kthreads = _kernel_threads()
    if not kthreads:
        pytest.skip("this PID namespace shows no kernel threads")
    fresh = host_holders._Kernel()
    monkeypatch.setattr(host_holders, "_KERNEL", fresh)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        n = host_holders.prime()
        known = [p for p in kthreads if fresh.known(p)]
        assert n == len(fresh.fds())
        assert len(known) >= min(len(kthreads), host_holders._Kernel.LIMIT) - 2  # some may exit
        assert not fresh.known(str(child.pid)) and not fresh.known(str(os.getpid()))
    finally:
        child.kill()
        child.wait()
        for fd in fresh.fds():
            os.close(fd)


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


@pytest.mark.fuse  # skipped without FUSE, failed on CI (tests/needs.py)
def test_a_descriptor_on_a_filesystem_that_cannot_answer_is_counted_not_fatal(
    file: Path, tmp_path: Path
) -> None:
    """Any process on the host may hold a file of a FUSE mount whose daemon is gone
    (here: powerfs after a cut): ``stat`` of its descriptor fails with ENOTCONN. The
    look goes on and counts the file's inode number (from ``fdinfo``) on any device, as
    it does an unreadable mapping's: a superset, still trusted. The whole suite once
    failed here while a power test ran beside it."""
    from durable_spaces.chaos.powerfs import mount

    (tmp_path / "b").mkdir()
    (tmp_path / "m").mkdir()
    fs = mount(tmp_path / "b", tmp_path / "m")
    try:
        with open(tmp_path / "m" / "out", "wb") as out:
            child = subprocess.Popen(["sleep", "60"], stdout=out)
        try:
            ino = os.stat(tmp_path / "m" / "out").st_ino
            holders = Holders(os.stat(file).st_dev)
            os.kill(fs.pid, signal.SIGKILL)  # the filesystem's daemon dies
            deadline = time.monotonic() + 30
            while True:  # once the kernel's cached attributes of the file expire
                try:
                    os.stat(f"/proc/{child.pid}/fd/1")
                except OSError as e:
                    assert e.errno == errno.ENOTCONN, e
                    break
                assert time.monotonic() < deadline, "stat still answers"
                time.sleep(0.05)
            held = holders.now()
            assert held is not None, "the look stays trusted"
            assert ino in held
        finally:
            child.kill()
            child.wait()
    finally:
        subprocess.run(["fusermount", "-uz", str(tmp_path / "m")], check=False)
