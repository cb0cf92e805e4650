"""The shared file mappings of one process, for the holders look (``host.holders``).

Why: that look needs only a process's *shared file* mappings, but ``/proc/<pid>/maps``
renders every mapping with its path: a Python interpreter has about 260, and on a
campaign's host (a dozen interpreters) the rendering was most of a checkpoint's look
(docs/performance.md). Linux 6.11's ``PROCMAP_QUERY`` ioctl on
the same file asks the kernel for the next mapping with given flags, so only the shared,
file-backed ones come back, and no path is rendered. The kernel's filter is the ``s`` of
``maps`` (``VM_MAYSHARE``), and both report the device and inode of the same inode
(``file_user_inode``), so the two sources agree. Where the kernel lacks the ioctl
(``ENOTTY``, ``EINVAL``) the text is read as before, for good in this process.

A mapping is named by its range as ``map_files`` names it (``%lx-%lx``, no zero
padding: ``maps`` pads low addresses to 8 digits, and ``map_files`` refuses a name with
a leading zero).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

__all__ = ["Mapping", "read_whole", "shared_mappings"]

#: (range as ``map_files`` names it, "" when that cannot be told; device as ``maps``
#: shows it, -1 when that cannot be told; inode).
Mapping = tuple[str, int, int]

# include/uapi/linux/fs.h: struct procmap_query (104 bytes), _IOWR('f', 17, ...).
_FMT = "=9Q4I2Q"
_SIZE = struct.calcsize(_FMT)
PROCMAP_QUERY = (3 << 30) | (_SIZE << 16) | (ord("f") << 8) | 17
_SHARED, _COVERING_OR_NEXT, _FILE_BACKED = 0x08, 0x10, 0x20
_FLAGS = _SHARED | _COVERING_OR_NEXT | _FILE_BACKED

#: Whether to ask the kernel (turned off at the first sign it cannot answer).
use_query = True


def shared_mappings(base: str) -> list[Mapping] | None:
    """The shared file mappings of the process (or thread) whose ``/proc`` directory is
    ``base``, inode 0 left out; None when it has no memory of its own (a kernel thread,
    a main thread that exited): ``maps`` would read empty. An exited process raises
    ``FileNotFoundError`` or ``ProcessLookupError``, an unreadable one
    ``PermissionError``."""
    global use_query
    if use_query:
        fd = os.open(f"{base}/maps", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _query(fd)
        except _NoQuery:
            use_query = False
        except _Unexpected:
            pass  # this process, this once: by the text
        finally:
            os.close(fd)
    return _from_text(read_whole(f"{base}/maps"))


class _NoQuery(Exception):
    """The kernel has no ``PROCMAP_QUERY``."""


class _Unexpected(Exception):
    """An answer of ``PROCMAP_QUERY`` this module does not expect (an error it does not
    know, a mapping before the last): the text is read instead, so the look stays
    trusted, and as exact as it was before the ioctl."""


def _query(fd: int) -> list[Mapping] | None:
    """The mappings by ``PROCMAP_QUERY`` (``_NoQuery``: the kernel cannot answer)."""
    buf = bytearray(_SIZE)
    out: list[Mapping] = []
    addr = 0
    while True:
        struct.pack_into(_FMT, buf, 0, _SIZE, _FLAGS, addr, *([0] * 12))
        try:
            fcntl.ioctl(fd, PROCMAP_QUERY, buf)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return out  # no shared file mapping at or after ``addr``
            if e.errno == errno.ESRCH:
                if addr == 0 and not out:
                    return None  # no memory of its own (as ``maps`` reads empty)
                raise ProcessLookupError(errno.ESRCH, "the process exited") from None
            if e.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
                raise _NoQuery from None
            if e.errno in (errno.EACCES, errno.EPERM):
                raise  # blind, as an unreadable ``maps`` is
            raise _Unexpected(str(e)) from None
        fields = struct.unpack_from(_FMT, buf)
        start, end, ino, major, minor = fields[3], fields[4], fields[8], fields[9], fields[10]
        if end <= addr:  # never: the next one ends past the last (a loop otherwise)
            raise _Unexpected(f"PROCMAP_QUERY answered a mapping ending at {end:#x}")
        if ino != 0:
            out.append((f"{start:x}-{end:x}", os.makedev(major, minor), ino))
        addr = end


def _from_text(data: bytes) -> list[Mapping] | None:
    """The same, from the text of ``maps``."""
    if not data:
        return None
    out: list[Mapping] = []
    # "s" as the permissions' last letter marks a shared mapping (even one mprotect-ed
    # read-only now may have been written before). A process has a few (glibc maps its
    # gconv cache so): find them without splitting every line.
    i = data.find(b"s ")
    while i != -1:
        start = data.rfind(b"\n", 0, i) + 1
        end = data.find(b"\n", i)
        end = len(data) if end == -1 else end
        fields = data[start:end].split(maxsplit=5)  # address perms offset dev inode [path]
        if len(fields) >= 5 and fields[1][3:4] == b"s" and fields[4] != b"0":
            out.append((_range(fields[0]), _dev(fields[3]), int(fields[4])))
        i = data.find(b"s ", end)
    return out


def _range(text: bytes) -> str:
    lo, _, hi = text.partition(b"-")
    try:
        return f"{int(lo, 16):x}-{int(hi, 16):x}"
    except ValueError:
        return ""  # not a range: nothing can look it up (``host.holders``: unsure)


def _dev(text: bytes) -> int:
    major, _, minor = text.partition(b":")
    try:
        return os.makedev(int(major, 16), int(minor, 16))
    except ValueError:
        return -1


def read_whole(path: str) -> bytes:
    """A ``/proc`` file whole, in as few reads as it takes (a buffered ``read`` asks in
    small steps, and each step renders the file's next part again)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 18):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
