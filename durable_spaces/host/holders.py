"""Which files of one filesystem some process on this host holds open or maps shared.

Why: a store through a shared writable ``mmap`` changes a file with no inotify event
and, while its page stays dirty, without moving the file's mtime either: neither a
change journal nor a stat key sees it. Such a store needs the file held: mapped shared
(``/proc/<pid>/maps``), or, once unmapped, still open (``/proc/<pid>/fd``; a mapping
keeps its file open, so its last close comes after every store and is an event of its
own: ``IN_CLOSE_WRITE``). A file no process holds cannot change silently, so a
checkpoint reads again exactly the held files whose stat key and events say nothing.

What it cannot see: processes blind to it from the start (``Holders``), processes
outside this host's view of ``/proc`` (another PID
namespace's parent, another machine sharing the filesystem), and descriptors in flight
in a Unix socket while nobody holds them; such a holder is seen once it holds the file
at a later look, or by its close's event.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from durable_spaces.host.maps import Mapping, shared_mappings
from durable_spaces.host.maps import read_whole as _read
from durable_spaces.host.proc_start import started

__all__ = ["Holders", "prime"]


class Holders:
    """The holders of files on device ``dev`` (the filesystem of a workspace), looked at
    again on each ``now``.

    A process whose ``/proc`` entries cannot be read (another user's without the
    privilege; one outside this user namespace, such as a sandbox's own PID 1) is blind
    to the look. Those blind at the start (when the object is made, or with ``lazy`` at
    its first look: the journal's start) are taken to hold nothing of the workspace, the
    same trust their descriptor writes get from the journal's events; a process that
    turns blind later (a command that made itself undumpable, another user's process
    started since) makes ``now`` None: nothing is trusted. A process is known by its pid
    and start time, so a reused pid is new.
    """

    def __init__(self, dev: int, *, lazy: bool = False) -> None:
        self.dev = dev
        #: Who was blind at the start (None: no look yet, ``lazy``).
        self._blind: frozenset[tuple[str, float]] | None = None
        self._mapped: MappingFiles = {}  # the last look's shared mappings (``_maps``)
        self._unsure = _fstype(dev) not in _SAME_DEV
        #: Why no look can be trusted at all (None: it can).
        self.problem: str | None = _hidden()
        if lazy or self.problem is not None:
            return
        # ``lazy``: the first ``now`` is the start instead (a checkpoint makes this
        # object, starts the journal, then looks: one look fewer, and the start
        # is then the journal's own, as the class doc says).
        first = self._look()
        if first is None:
            self.problem = "cannot list /proc"
        else:
            self._blind = frozenset(first[1])

    def now(self) -> set[int] | None:
        """Inode numbers on ``dev`` some process holds open or maps shared (where the
        mapping's file cannot be looked up, its inode number on any device: a
        superset); None when a process that was not blind at the start is now, or when
        no look can be trusted (``problem``)."""
        if self.problem is not None:
            return None
        look = self._look()
        if look is None:
            return None
        held, blind = look
        if self._blind is None:
            self._blind = frozenset(blind)  # the start (``lazy``)
        elif not blind <= self._blind:
            return None
        return held

    def _look(self) -> tuple[set[int], set[tuple[str, float]]] | None:
        held: set[int] = set()
        blind: set[tuple[str, float]] = set()
        try:
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return None
        seen, self._mapped = self._mapped, {}
        for pid in pids:
            if _KERNEL.known(pid):
                continue  # a kernel thread: no descriptors, no mappings (``_Kernel``)
            try:
                _fds(f"/proc/{pid}", self.dev, held)
                if not _maps(f"/proc/{pid}", self.dev, held, seen, self._mapped, self._unsure):
                    if _KERNEL.learn(pid):
                        continue
                    self._threads(pid, held, seen)
            except (FileNotFoundError, ProcessLookupError):
                continue  # it exited: its files were closed, each close an event
            except PermissionError:
                blind.add((pid, _started(pid)))
            except _Unsure:
                return None
        held |= kernel_held(self.dev)
        return held, blind

    def _threads(self, pid: str, held: set[int], seen: MappingFiles) -> None:
        """A process whose main thread exited shows no mappings or descriptors of its
        own while its other threads still hold them: look through one of those."""
        for tid in os.listdir(f"/proc/{pid}/task"):
            if tid != pid:
                base = f"/proc/{pid}/task/{tid}"
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    _fds(base, self.dev, held)
                    if _maps(base, self.dev, held, seen, self._mapped, self._unsure):
                        return


class _Kernel:
    """The kernel threads this process has found, each by an open ``/proc/<pid>``.

    Why: most of a small host's processes are kernel threads (61 of 67 here), and each
    cost a look as long as a user process's (a descriptor listing, an empty ``maps``,
    a listing of its threads) to find nothing: a kernel thread has no mappings and no
    descriptors of its own (they all share the kernel's empty table). A kernel thread
    never turns into a user process, so once one is found it is skipped while the
    directory opened for it still answers: a pid reused after it exited names a new
    process, and the old directory then fails (``ESRCH``), so the new one is looked at
    again. At most ``LIMIT`` are kept, and no more than an eighth of the process's
    descriptor limit (each holds one); beyond that they are looked at as before. Shared
    by every ``Holders`` of the process."""

    LIMIT = 256

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self.limit = min(self.LIMIT, fd_limit() // 8)

    def known(self, pid: str) -> bool:
        fd = self._fds.get(pid)
        if fd is None:
            return False
        try:
            os.stat(".", dir_fd=fd)
            return True
        except OSError:  # it exited: the pid, if listed, is someone new
            with self._lock:
                if self._fds.get(pid) == fd:
                    del self._fds[pid]
                    os.close(fd)
            return False

    def fds(self) -> list[int]:
        """The directories kept open (``/proc`` ones: never a workspace's file)."""
        with self._lock:
            return list(self._fds.values())

    def learn(self, pid: str) -> bool:
        """Whether ``pid`` (which showed no mappings) is a kernel thread; kept if so."""
        try:
            fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            # Read through the directory just opened: the flags are this process's.
            st = os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)
            try:
                data = os.read(st, 4096)
            finally:
                os.close(st)
            fields = data[data.rfind(b")") + 2 :].split()
            kernel = len(fields) > 6 and int(fields[6]) & _PF_KTHREAD != 0
        except (OSError, ValueError):
            kernel = False
        with self._lock:
            if kernel and pid not in self._fds and len(self._fds) < self.limit:
                self._fds[pid] = fd
                return True
        os.close(fd)
        return kernel


def prime() -> int:
    """Find this host's kernel threads now (``_Kernel``), so the first look of this
    process's first checkpoint skips them; returns how many are known. For a driver
    started before its launch (``drive/warm_driver.py``): on a small host most processes
    are kernel threads, and the first look of an attempt's first checkpoint spent most of
    its time on them, which a spare pays while it waits instead. Nothing else of the
    look is kept: who holds what is looked at again by each ``Holders``."""
    with contextlib.suppress(OSError):
        for pid in os.listdir("/proc"):
            if pid.isdigit() and not _KERNEL.known(pid):
                _KERNEL.learn(pid)
    return len(_KERNEL.fds())


def fd_limit() -> int:
    """The process's soft limit of open descriptors (1024 where it cannot be read)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1024
    return soft if soft > 0 else 1024


#: ``PF_KTHREAD`` in the flags of ``/proc/<pid>/stat`` (include/linux/sched.h).
_PF_KTHREAD = 0x00200000
_KERNEL = _Kernel()


def kernel_held(dev: int) -> set[int]:
    """Inodes on ``dev`` the kernel itself writes with no process holding them and no
    event: the backing files of loop devices (their writes do not go through the calls
    inotify hooks) and swap files."""
    held: set[int] = set()
    paths: list[str] = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/sys/block"):
            if name.startswith("loop"):
                with contextlib.suppress(OSError):
                    paths.append(_read(f"/sys/block/{name}/loop/backing_file").decode().strip())
    with contextlib.suppress(OSError):
        for line in _read("/proc/swaps").decode(errors="replace").splitlines()[1:]:
            if line.split() and line.split()[1:2] == ["file"]:
                paths.append(line.split()[0])
    for path in paths:
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if st.st_dev == dev:
                held.add(st.st_ino)
    return held


def _hidden(mountinfo: bytes | None = None) -> str | None:
    """Why ``/proc`` may leave processes out of its listing (``hidepid``: not even as
    blind entries), or None; ``mountinfo`` is this process's mount table."""
    if mountinfo is None:
        try:
            mountinfo = _read("/proc/self/mountinfo")
        except OSError as e:
            return f"cannot read /proc/self/mountinfo: {e.strerror}"
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[4] != b"/proc":
            continue
        options = set(fields[5].split(b",") + fields[-1].split(b","))  # mount's, super's
        hides = any(o.startswith(b"hidepid=") for o in options - _SHOWN)
        if hides and os.geteuid() != 0:
            return "/proc is mounted with hidepid: other users' processes are not listed"
    return None


def _fstype(dev: int) -> str | None:
    """The type of the filesystem mounted as device ``dev`` (None: not found)."""
    want = f"{os.major(dev)}:{os.minor(dev)}".encode()
    with contextlib.suppress(OSError):
        for line in _read("/proc/self/mountinfo").splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == want and b"-" in fields:
                return fields[fields.index(b"-") + 1].decode(errors="replace")
    return None


#: Filesystems whose ``maps`` lines show the device and inode ``stat`` does.
_SAME_DEV = frozenset({"ext2", "ext3", "ext4", "xfs", "tmpfs", "f2fs"})

#: ``hidepid`` values that list every process.
_SHOWN = {b"hidepid=0", b"hidepid=off"}


def _started(pid: str) -> float:
    """The start of ``pid`` since boot (``host.proc_start``); -1.0 when it cannot be read."""
    try:
        return started(int(pid))
    except psutil.NoSuchProcess:
        return -1.0


def _fds(base: str, dev: int, held: set[int]) -> None:
    if base == f"/proc/{os.getpid()}":
        _own_fds(dev, held)
        return
    # Readable exactly when its descriptors are (both need ptrace read access): a
    # process that hides them (pid 1 of another user namespace here, with 259) is told
    # blind without listing them all first. None for a kernel thread or a zombie.
    with contextlib.suppress(FileNotFoundError):
        os.readlink(f"{base}/exe")
    with os.scandir(f"{base}/fd") as it:
        for e in it:
            try:
                s = os.stat(e.path)  # the magic link: the open file itself
            except (FileNotFoundError, NotADirectoryError):
                continue  # closed meanwhile
            except OSError:
                # A file whose filesystem cannot answer (ENOTCONN: a FUSE mount whose
                # daemon died, EIO): its device is unknown, so its inode number counts
                # on any device, as an unreadable mapping's does (a superset).
                with contextlib.suppress(FileNotFoundError):  # closed meanwhile
                    held.add(_fdinfo_inode(f"{base}/fdinfo/{e.name}"))
                continue
            if s.st_dev == dev:
                held.add(s.st_ino)


def _fdinfo_inode(path: str) -> int:
    """The inode number ``fdinfo`` gives a descriptor (``ino:``, Linux 5.14 on);
    ``_Unsure`` when it gives none (the look cannot be trusted), ``FileNotFoundError``
    when the descriptor was closed meanwhile."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise
    except OSError:
        raise _Unsure from None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "ino" and value.strip().isdigit():
            return int(value.strip())
    raise _Unsure


def _own_fds(dev: int, held: set[int]) -> None:
    """This process's own descriptors, by ``fstat`` (a path through ``/proc`` for each
    cost several times more, and the checkpointing process has the most: its log, its
    store, its journals), less those its own caches hold (``not_workspace``): skipped
    only if a cache held them before and after the look (a cache lets a descriptor go
    before it is closed, so one reused meanwhile is not in both)."""
    before = _ours()
    later = []
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
        except ValueError:
            continue
        if fd in before:
            later.append(fd)
        else:
            _own_fd(fd, dev, held)
    after = _ours()
    for fd in later:
        if fd not in after:
            _own_fd(fd, dev, held)


def _own_fd(fd: int, dev: int, held: set[int]) -> None:
    try:
        s = os.fstat(fd)
    except OSError as e:
        if e.errno == errno.EBADF:
            return  # closed meanwhile (the listing's own descriptor, for one)
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            held.add(_fdinfo_inode(f"/proc/self/fdinfo/{fd}"))  # as in ``_fds``
        return
    if s.st_dev == dev:
        held.add(s.st_ino)


def _ours() -> set[int]:
    fds = set(_KERNEL.fds())
    for more in _NOT_WORKSPACE:
        fds.update(more())
    return fds


#: Descriptors of this process that are never a file of a workspace, by who keeps them.
_NOT_WORKSPACE: list[Callable[[], Iterable[int]]] = []


def not_workspace(fds: Callable[[], Iterable[int]]) -> None:
    """Say that ``fds()`` are always descriptors of this process that hold no file of a
    workspace (a cache of its own: ``adapter/checkpoints/inode_pool.py``'s unnamed files), so the
    look at this process skips them (90 of the 98 a bench's process held were such)."""
    _NOT_WORKSPACE.append(fds)


#: What a shared mapping's file is as ``stat`` sees it, by (process directory, and the
#: mapping as ``host.maps`` tells it: range, device, inode); None: it could not be looked up.
MappingFiles = dict[tuple[str, str, int, int], "tuple[int, int] | None"]


def _mapped_file(base: str, mapping: Mapping, dev: int, unsure: bool) -> tuple[int, int] | None:
    """(device, inode) of the file of one shared mapping as ``stat`` sees it; None when
    that cannot be told; (-1, 0) when the mapping went meanwhile."""
    rng, mdev, ino = mapping
    if "/task/" not in base and rng:  # a thread's directory has no map_files
        try:
            # The file as a path sees it (overlay, btrfs subvolumes: the dev of maps
            # is the backing superblock's, not the one ``stat`` reports).
            s = os.stat(f"{base}/map_files/{rng}")
            return s.st_dev, s.st_ino
        except PermissionError:
            pass  # map_files needs CAP_SYS_ADMIN: maps' own numbers, below
        except OSError:
            # Unmapped meanwhile (its file's close says the rest), or its filesystem
            # cannot answer (ENOTCONN: a FUSE daemon gone), which the workspace's does:
            # not a file of it. (Taken as unknown, one such mapping anywhere on the
            # host, a killed driver's SQLite shm on a cut powerfs, made every look
            # at an overlay workspace untrusted.)
            return -1, 0
    if mdev < 0:
        return None
    return (mdev, ino) if mdev == dev or not unsure else None


class _Unsure(Exception):
    """A shared mapping whose file cannot be told from the workspace's: without
    ``map_files``, on a filesystem whose ``maps`` device is not the one ``stat`` shows."""


def _maps(
    base: str, dev: int, held: set[int], seen: MappingFiles, now: MappingFiles, unsure: bool = True
) -> bool:
    """The shared mappings of the process at ``base`` (``now`` gets what ``seen`` knew,
    and what it learns, of each); whether it has memory of its own at all (``maps``
    reads empty otherwise). ``unsure``: the workspace's filesystem may show ``maps``
    another device than ``stat`` (overlay, btrfs; or not known), so a mapping on another
    device that cannot be looked up (``_Unsure``) makes the look untrusted."""
    found = shared_mappings(base)
    if found is None:
        return False
    for mapping in found:
        key = (base, *mapping)
        file = seen[key] if key in seen else _mapped_file(base, mapping, dev, unsure)
        now[key] = file
        if file is None:
            raise _Unsure(base)
        if file[0] == dev:
            held.add(file[1])
    return True
