"""powerfs: a filesystem that can lose power (after Jepsen's LazyFS), for the chaos lab.

A FUSE mount over a *backing* directory. Processes see every change at once; the backing
directory holds only what the durability calls below made durable, and a cut (``cut()``)
drops everything else and remounts on the backing state. See ``api.mount``.

Rules modeled (the strict POSIX reading; a real filesystem may persist *more*, never less
than what is listed as durable):

1. File data and size changed by ``write``/``pwrite``/``truncate``/``ftruncate``/
   ``open(O_TRUNC)``/``fallocate`` (mode 0), and writes through a shared ``mmap``, are
   volatile until ``fsync`` or ``fdatasync`` of that file (on any fd of it, through any of
   its names). ``msync(MS_SYNC)`` counts (the kernel sends an fsync). ``O_SYNC``/``O_DSYNC``
   files sync every write (``O_SYNC`` as fsync, ``O_DSYNC`` as fdatasync).
2. Inode metadata (mode, owner, atime/mtime) changed by ``chmod``/``chown``/``utimens`` is
   volatile until ``fsync`` of the inode (a file or a directory); ``fdatasync`` does not
   make it durable. A durable inode's times are the live ones at its last fsync.
3. Directory entries (``create``, ``mknod``, ``mkdir``, ``symlink``, ``link``, ``unlink``,
   ``rmdir``, ``rename``, also ``RENAME_NOREPLACE``/``RENAME_EXCHANGE``) are volatile until
   ``fsync`` of the directory holding them (``open(dir, O_RDONLY)`` + ``fsync``). fsync of
   a file does **not** make its name durable (ext4 happens to, POSIX does not promise it):
   a created file, fsynced, but its directory not, is gone after a cut; a rename is durable
   in each directory when that directory is fsynced, so a cross-directory rename with only
   the target directory fsynced leaves the file under both names (two hard links), and
   with only the source fsynced under neither. Exception: a directory has at most one
   durable name, so making its new name durable also removes the old one; and if applying
   one directory's entries would put a directory inside itself (nested directories moved
   around each other), every directory's entries are made durable (a ``tree_sync``).
4. A new inode named durably before its data was synced comes back empty (a zero-length
   file, as on ext4 after a crash); data synced before its name was durable is kept and
   shows up once a directory fsync names it.
5. A cut drops rules 1 to 3's volatile state. With tearing (``tear=True``; seeded by
   ``random.Random``), the last unsynced write request of each durable file lands in part:
   its bytes up to a 512-byte file offset strictly inside it (or none of it) survive; the
   boundary is drawn from the mount's seed, the cut's number, the file and the write, so
   the same run tears at the same place. Earlier unsynced writes of that file are dropped.
6. A clean ``unmount()`` makes everything durable (as umount flushes); ``unmount(sync=
   False)`` drops it, as a cut does.

Not modeled (stated, so nobody relies on it):

- Reordering inside one file's unsynced writes other than rule 5 (a real page cache may
  write any subset of dirty pages back before a crash); writes are never lost *after* an
  fsync covered them. Nothing becomes durable on its own (no dirty-page writeback timer).
- ``sync()``/``syncfs()``: the kernel does not forward them to a FUSE server, so they make
  nothing durable here; ``sync_file_range`` does not either (on Linux it is no durability
  call: no metadata, no disk cache flush). ``O_DIRECT`` is accepted and stripped: its data
  is volatile until fsync like any other (a disk's write cache can hold it too).
- Timestamp-only loss as a separate event (mtime follows rule 2), extended attributes (not
  supported: ENOTSUP), ACLs, ``O_TMPFILE``, file locks (local to the kernel, correct on one
  machine; they do not survive a cut, as they do not survive a reboot).
- Media errors, ENOSPC injection, a failed fsync (fsync always succeeds), and partial
  loss of metadata ops within one directory (a directory fsync is all-or-nothing).

A slow disk (``disk``): ``PowerFS.latency(ms)`` delays every durability call,
``PowerFS.stall(seconds)`` holds them (plain writes go on into the page cache) until the
stall ends or ``resume()``; a cut during a stall fails the held calls and drops what they
were making durable. ``disk.py`` states the model.

Layout: the backing dir is the durable image at every moment (``image``); the live tree
(``<state_dir>/live``, a copy of the image made at each boot) and the server's memory
(``volatile``) hold the rest. The name ``.powerfs`` in the backing root is reserved (inodes
durable but not yet named). Files open across a cut get ENOTCONN ("Transport endpoint is
not connected"; a request in flight at the cut: ECONNABORTED) on every later call; their
mmaps keep their pages and fault with SIGBUS beyond them. Reopen by path after the cut.

Modules: ``volatile`` (what a cut loses), ``image`` (the durable tree), ``ops`` (the FUSE
passthrough), ``cut`` (tearing), ``disk`` (latency and stalls), ``server`` (one boot),
``supervisor`` (cuts, the control socket), ``api`` (``mount``/``attach``/``PowerFS``).
"""

from durable_spaces.chaos.powerfs.api import (
    CutReport,
    DiskState,
    PowerFS,
    Stats,
    Tear,
    attach,
    mount,
)
from durable_spaces.chaos.powerfs.api import unavailable as unavailable
from durable_spaces.chaos.powerfs.powerfs_errors import FuseUnavailableError, PowerFSError

__all__ = [
    "CutReport",
    "DiskState",
    "FuseUnavailableError",
    "PowerFS",
    "PowerFSError",
    "Stats",
    "Tear",
    "attach",
    "mount",
    "unavailable",
]
