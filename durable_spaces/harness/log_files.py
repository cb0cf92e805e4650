"""Opening the durable log's files without trusting what sits at their paths.

A log path comes from configuration (an option, ``CUA_SESSION_STATE_DIR``), so whatever
is found there is checked before it is used:

- never through a symlink: every file is opened with ``O_NOFOLLOW`` and every sidecar
  (``-wal``, ``-shm``, ``.lock``, the fence directory and its markers) is ``lstat``-ed
  first; a symlink planted at any of them would make the log write wherever it points;
- only regular files (directories): a directory or a FIFO at the path is named as such
  (a FIFO is opened ``O_NONBLOCK`` so it cannot hang the opener);
- private: files are created 0600, directories 0700. A file or directory of ours found
  looser is *tightened* (``fchmod`` on the descriptor opened above, never by name) with a
  ``LooseModeWarning``, and only after its contents were recognised as a log, so another
  program's file never has its mode changed. Tightening rather than refusing: a log
  copied under a permissive umask must not stop a session for good, and ``chmod 600`` is
  exactly what an operator would do about it.

SQLite's files need one more care (``hold``): a descriptor of a database file is never
closed while a SQLite connection of this process may hold POSIX locks on it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import warnings
from pathlib import Path

from durable_spaces.errors import LogError, LooseModeWarning, StorageLockedError
from durable_spaces.host.files import fsync_dir
from durable_spaces.host.files import kind_words as _kind

FILE_MODE = 0o600
DIR_MODE = 0o700
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def refusal(path: Path, err: OSError, what: str) -> LogError:
    """The ``LogError`` for an ``open`` of ``path`` that failed with ``err``."""
    if err.errno == errno.ELOOP:
        return LogError(
            f"{what} {path} is a symbolic link; a log is never opened through one "
            "(point the log at the real file instead)"
        )
    if err.errno == errno.EISDIR:
        return LogError(f"{what} {path} is a directory, not a file")
    if err.errno == errno.ENOENT:
        return LogError(f"{what} {path}: its directory {path.parent} does not exist")
    if err.errno == errno.ENOTDIR:
        return LogError(f"{what} {path}: a component of {path.parent} is not a directory")
    return LogError(f"{what} {path} cannot be opened: {err.strerror or err}")


def open_file(path: Path, flags: int, *, what: str, create: bool = False) -> tuple[int, bool]:
    """Open ``path`` as a regular file, never through a symlink; create it 0600 when
    ``create`` and missing. Returns ``(fd, created)``; a new entry's directory is synced."""
    created = False
    try:
        if create:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW, FILE_MODE)
                created = True
            except FileExistsError:
                fd = os.open(path, flags | _NOFOLLOW)
        else:
            fd = os.open(path, flags | _NOFOLLOW)
    except OSError as e:
        raise refusal(path, e, what) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LogError(f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        if created:
            fsync_dir(path.parent)
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def tighten(fd: int, path: Path, what: str, mode: int = FILE_MODE) -> None:
    """Drop every permission bit beyond ``mode`` from the file or directory ``fd`` (a real
    descriptor, or an ``O_PATH`` one, changed through ``/proc/self/fd``)."""
    current = stat.S_IMODE(os.fstat(fd).st_mode)
    if current & ~mode == 0:
        return
    try:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_PATH:
            os.chmod(f"/proc/self/fd/{fd}", current & mode)  # the inode fd names
        else:
            os.fchmod(fd, current & mode)
    except OSError as e:
        raise LogError(
            f"{what} {path} is mode {current:04o} and cannot be made private: {e.strerror}"
        ) from None
    warnings.warn(
        f"{what} {path} was mode {current:04o}; tightened to {current & mode:04o}",
        LooseModeWarning,
        stacklevel=3,
    )


def check_sidecar(path: Path, what: str) -> None:
    """A sidecar SQLite creates by name (``-wal``, ``-shm``): absent, or a private regular
    file; a symlink or anything else there is refused before SQLite can follow it.

    Looked at through an ``O_PATH`` descriptor only: closing a real descriptor of a file
    would drop every POSIX lock this process holds on it, SQLite's WAL-index locks
    included (an ``O_PATH`` one holds no locks to drop)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as e:
        raise refusal(path, e, what) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LogError(f"{what} {path} is {_kind(st.st_mode)}; refusing to use the log")
        tighten(fd, path, what)
    finally:
        os.close(fd)


class _Held:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.count = 1
        self.extra: list[int] = []


_HELD: dict[tuple[int, int], _Held] = {}
_HELD_LOCK = threading.Lock()


def hold(path: Path, what: str) -> int:
    """A read-only descriptor of the regular file ``path`` (never through a symlink),
    shared by every holder of the same file in this process; give it back with
    ``unhold``.

    Why shared: POSIX record locks belong to a process and an inode, and closing *any*
    descriptor of the file drops all of them. SQLite locks its database that way, so a
    descriptor of ours opened and closed beside a live connection of this process would
    silently unlock it (another process then checkpoints and deletes the WAL under it:
    lost commits). One descriptor per file, closed when its last holder is done (after
    the holders closed their connections), never drops a lock that is still wanted."""
    with _HELD_LOCK:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise LogError(f"{what} {path} does not exist") from None
        held = _HELD.get((st.st_dev, st.st_ino))
        if held is not None and stat.S_ISREG(st.st_mode):
            held.count += 1
            return held.fd
        fd, _ = open_file(path, os.O_RDONLY, what=what)
        return _adopt_locked(fd)


def adopt(fd: int) -> int:
    """Make an open descriptor a held one (as if from ``hold``); returns the held one."""
    with _HELD_LOCK:
        return _adopt_locked(fd)


def _adopt_locked(fd: int) -> int:
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    held = _HELD.get(key)
    if held is None:
        _HELD[key] = _Held(fd)
        return fd
    held.extra.append(fd)  # a second descriptor of a held file: never close it early
    held.count += 1
    return held.fd


def unhold(fd: int) -> None:
    """Give back a descriptor from ``hold``; the last holder's return closes it."""
    with _HELD_LOCK:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        held = _HELD.get(key)
        if held is None or held.fd != fd:
            raise LogError(f"descriptor {fd} was not held")
        held.count -= 1
        if held.count == 0:
            del _HELD[key]
            for f in (held.fd, *held.extra):
                os.close(f)


def private_dir(path: Path, what: str) -> None:
    """Make sure ``path`` is a directory of ours: created 0700 (with missing parents) if
    absent, refused if it is a symlink or not a directory, tightened if looser."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except OSError as e:
            raise LogError(f"{what} {path} cannot be created: {e.strerror or e}") from None
        st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise LogError(f"{what} {path} is {_kind(st.st_mode)}, not a directory")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise refusal(path, e, what) from None
    try:
        tighten(fd, path, what, DIR_MODE)
    finally:
        os.close(fd)


class OwnerLock:
    """An advisory ``flock`` on ``<path>.lock``, held until ``release()`` or process death.

    Why a sidecar lock at all: two processes appending to one log without coordination
    is silent corruption, so an unfenced storage takes it exclusively for its whole life;
    fenced writers (a stale driver and its successor) take it shared, because there the
    epoch fence keeps them apart. The kernel drops the lock when the owner dies, so a
    SIGKILLed driver never leaves a stale lock behind (a pid file would)."""

    def __init__(self, path: Path, *, exclusive: bool) -> None:
        self.path = Path(f"{path}.lock")
        fd, _ = open_file(self.path, os.O_RDWR, what="log lock file", create=True)
        self._fd: int | None = fd
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(fd)
            self._fd = None
            if exclusive:
                why = f"is already open{holder}; one process owns a log at a time"
            else:
                why = f"is owned exclusively{holder}; fenced writers must wait"
            raise StorageLockedError(
                f"log {path} {why} until that process closes it or exits (lock file {self.path})"
            ) from None
        try:
            tighten(fd, self.path, "log lock file")
        except BaseException:
            self.release()
            raise
        self._exclusive = exclusive
        if exclusive:  # only the sole owner may write its pid into the lock file
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())

    def _holder(self) -> str:
        """Who holds the lock, for the message: the pid an exclusive owner wrote, if alive."""
        assert self._fd is not None
        try:
            pid = int(os.pread(self._fd, 32, 0).decode().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return " by another process"
        return " in this process" if pid == os.getpid() else f" by process {pid}"

    def release(self) -> None:
        if self._fd is not None:
            if getattr(self, "_exclusive", False):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None
