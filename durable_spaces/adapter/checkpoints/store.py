"""Where workspace checkpoints live outside any Space: the ``CheckpointStore`` protocol
and ``DirectoryCheckpointStore``, a directory of manifests and content-addressed blobs.

Layout: ``<id>.manifest`` (an incremental checkpoint, ``manifest.py``), ``<id>.tar``
(one an older adapter took: still read), ``blobs/<sha256>`` (a file's bytes, stored once
for every checkpoint that holds them), ``.lock`` and ``.generation`` (below).

A store is read back after crashes and may be shared, so it trusts nothing it finds:
names are checkpoint ids that parse (``checkpoints.ids``) or sha256 digests, every file is
opened relative to the store's directory without following symlinks, and anything but a
regular file is a bad copy, not a crash. Callers verify bytes against their names.

Writes go in batches (``batch``, ``checkpoints.batch``): a manifest's file also
carries the bytes of the small blobs it adds (``checkpoints.carry``), so one fsync makes
the checkpoint durable; those blobs' own files are renamed into ``blobs/`` after it,
unsynced. Other blobs are fsynced and their directory too *before* the manifest is
renamed into place. So a manifest on disk never names a blob that has no durable copy,
and a file in ``blobs/`` always has one (itself, or a carrier). ``get_blob`` reads a
small blob whose file is missing or damaged from a manifest that carries it, and mends
the file. A carrier is removed (``prune``, ``delete``) or replaced only after the blobs
it carries are synced in ``blobs/`` (``_retire``).

``prune`` deletes manifests not kept and then blobs no remaining manifest names, under
the store's exclusive lock (a batch holds it shared from its first look at what is
there to its last rename), bumping ``.generation`` first so that a writer that
remembered what the store held looks again. A crash anywhere in a prune leaves garbage
at worst: a blob goes only when no manifest left on disk names it.

Large files are copied with a reflink (``FICLONE``) where the filesystem has them and
hashed from the clone, never hard-linked: a blob never shares a mutable inode with the
workspace it came from.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

from durable_spaces.adapter.checkpoints import carry
from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.batch import (
    CLONE_MIN,
    NOFOLLOW,
    Batch,
    fsync_all,
    read_all,
    write_all,
)
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.adapter.checkpoints.inode_pool import POOL, InodePool
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import CheckpointCopyError
from durable_spaces.host.files import kind_words as _kind

logger = logging.getLogger(__name__)

BLOBS = "blobs"
_DIR = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW


@runtime_checkable
class CheckpointStore(Protocol):
    """Workspace checkpoints kept outside any Space, keyed by id, and the blobs their
    manifests name, keyed by sha256. Writes are atomic; an id (a blob's name) records
    its bytes' digest, so it always names the same bytes.

    ``get`` / ``get_blob`` return None when the thing is not there and raise
    ``CheckpointCopyError`` when what is there is not a usable copy (a symlink, a
    directory, unreadable); callers verify the bytes against the name either way."""

    def put(self, checkpoint_id: str, data: bytes) -> None: ...

    def get(self, checkpoint_id: str) -> bytes | None: ...

    def delete(self, checkpoint_id: str) -> None: ...

    def get_blob(self, sha: str) -> bytes | None: ...

    def batch(self, sync: bool = True, *, refill_now: bool = True) -> Batch: ...


class DirectoryCheckpointStore:
    """A directory (local or shared) of checkpoints and blobs (module doc).

    The directory is 0700 and its files 0600 (they hold workspaces). Only valid ids and
    digests name files; every file is opened with ``ONOFOLLOW`` after an ``lstat``, so
    a symlink, FIFO or device planted here is refused as a bad copy, never followed or
    opened. ``put`` of an id whose file is there but damaged replaces it.

    ``in_space=True`` is the copy kept beside a Space's workspace when that is a
    directory of this host (``snapshots``): no lock (the Space's own fenced command
    prunes it), and a symlink or file planted at its own name or at ``blobs`` is removed
    (those names are ours), never followed."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        in_space: bool = False,
        pool: InodePool = POOL,
        owner: tuple[int, int] | None = None,
        make_ahead: bool = True,
    ) -> None:
        """``make_ahead``: files made ahead for the next batch (``Settings.inode_pool``)."""
        self.dir = Path(directory)
        self.in_space = in_space
        #: (uid, gid) given to every file and directory it makes (None: left as made):
        #: a container's copy, written from this host, pruned by the container's user.
        self.owner = owner
        self.pool = pool  # files made ahead for its batches (``inode_pool``)
        self.make_ahead = make_ahead
        if not in_space:
            made = [p for p in (self.dir, *self.dir.parents) if not p.exists()]
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            for p in made:  # each one's name durable in its parent, as a power cut keeps it
                _sync_dir(p.parent)
            with contextlib.suppress(OSError):
                st = self.dir.stat()
                if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
                    self.dir.chmod(0o700)

    # --- names ------------------------------------------------------------------------

    def _path(self, checkpoint_id: str) -> tuple[CheckpointId, str]:
        cid = CheckpointId.parse(checkpoint_id, f"checkpoint store {self.dir}", "workspace")
        return cid, f"{cid}{cid.suffix}"

    def location(self, checkpoint_id: str) -> str:
        """The file that holds (or would hold) the checkpoint, for messages."""
        return str(self.dir / self._path(checkpoint_id)[1])

    def blob_location(self, sha: str) -> str:
        return str(self.dir / BLOBS / _blob_name(sha))

    def ids(self) -> list[CheckpointId]:
        """The checkpoints in the store (files whose name is not an id are ignored)."""
        found = []
        for p in self.dir.iterdir() if self.dir.is_dir() else ():
            for suffix in (".manifest", ".tar"):
                if p.name.endswith(suffix):
                    cid = CheckpointId.valid(p.name.removesuffix(suffix), "workspace")
                    if cid is not None and cid.suffix == suffix:
                        found.append(cid)
        return sorted(found)

    # --- checkpoints and blobs ----------------------------------------------------------

    def put(self, checkpoint_id: str, data: bytes) -> None:
        cid, _ = self._path(checkpoint_id)
        if not cid.matches(data):
            raise CheckpointCopyError(f"refusing to store bytes that are not checkpoint {cid}")
        with contextlib.suppress(CheckpointCopyError):
            old = self.get(cid)
            if old is not None and cid.matches(old):
                return  # already there, intact
        with self.batch() as b:
            b.manifest(cid, data)

    def get(self, checkpoint_id: str) -> bytes | None:
        """The checkpoint's bytes (a manifest without the blobs its file carries)."""
        _, name = self._path(checkpoint_id)
        data = self._read(name, self.location(checkpoint_id), blob=False)
        return None if data is None else carry.split(data)

    def get_blob(self, sha: str) -> bytes | None:
        """The blob's bytes: its file's, or where that is missing or not these bytes
        (a power cut took what was never synced), a carrier's, the file then mended.
        Large blobs (never carried) are returned as found: callers verify."""
        where = self.blob_location(sha)
        problem: CheckpointCopyError | None = None
        try:
            data = self._read(_blob_name(sha), where, blob=True)
        except CheckpointCopyError as e:
            data, problem = None, e
        if data is not None and (len(data) >= CLONE_MIN or hashlib.sha256(data).hexdigest() == sha):
            return data
        found = None if self.in_space else self._from_carrier(sha)
        if found is None:
            if problem is not None:
                raise problem
            return data
        logger.warning(
            "%s is %s; read from the manifest %s that carries it, and mended",
            where,
            "missing" if data is None and problem is None else "damaged",
            found[1],
        )
        try:
            with self.batch() as b:
                b.add(found[0], replace=True)
        except (OSError, CheckpointCopyError) as e:
            logger.warning("could not mend %s: %s", where, e)
        return found[0]

    def delete(self, checkpoint_id: str) -> None:
        """Delete a checkpoint (the blobs its file carries synced in ``blobs/`` first)."""
        _, name = self._path(checkpoint_id)
        try:
            dfd, bfd = self._open_dirs()
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            lock = None if self.in_space else self._lock(dfd, fcntl.LOCK_EX)
            try:
                self._retire(dfd, bfd, [name])
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    os.unlink(name, dir_fd=dfd)
            finally:
                if lock is not None:
                    os.close(lock)
        finally:
            os.close(bfd)
            os.close(dfd)

    def batch(self, sync: bool = True, *, refill_now: bool = True) -> Batch:
        """A batch of writes (``sync`` False: not fsynced, for a copy that is only a
        fast path because a store holds the same; ``refill_now`` False: the files it
        used are made again when its ``refill`` is called, ``Batch``)."""
        return Batch(self, shared_lock=not self.in_space, sync=sync, refill_now=refill_now)

    # --- garbage -------------------------------------------------------------------------

    def prune(self, keep: Iterable[str] | None = None) -> list[str]:
        """Delete the checkpoints not in ``keep`` (None: keep every one), then the blobs
        no remaining manifest names and temporaries a killed writer left; returns what
        went. A manifest that cannot be read (damaged, refused) keeps every blob: a
        prune never guesses what a checkpoint needs."""
        dfd, bfd = self._open_dirs()
        removed: list[str] = []
        lock = self._lock(dfd, fcntl.LOCK_EX)
        try:
            self._bump_generation(dfd)
            keep_ids = None if keep is None else {str(CheckpointId.parse(k)) for k in keep}
            gone = [c for c in self.ids() if keep_ids is not None and str(c) not in keep_ids]
            needed = self._needed([c for c in self.ids() if c not in gone])
            # What the manifests going carry, and the rest still need, synced first.
            self._retire(dfd, bfd, [f"{c}{c.suffix}" for c in gone], needed)
            for cid in gone:
                os.unlink(f"{cid}{cid.suffix}", dir_fd=dfd)
                removed.append(str(cid))
            os.fsync(dfd)
            hit("checkpoint_store.prune")  # manifests gone, blobs not yet: garbage only
            if needed is None:
                return removed
            for name in os.listdir(bfd):
                if mf.BLOB_NAME.fullmatch(name) and name not in needed:
                    os.unlink(name, dir_fd=bfd)
                    removed.append(f"{BLOBS}/{name}")
            for name in os.listdir(dfd):
                if name.startswith(".tmp-"):
                    os.unlink(name, dir_fd=dfd)
        finally:
            os.close(lock)
            os.close(bfd)
            os.close(dfd)
        return removed

    def _needed(self, ids: list[CheckpointId]) -> set[str] | None:
        """Every blob the manifests ``ids`` name; None (keep every blob) when one cannot
        be read: a prune never guesses what a checkpoint needs."""
        needed: set[str] = set()
        for cid in ids:
            if cid.form != "manifest":
                continue
            try:
                data = self.get(cid)
            except CheckpointCopyError as e:
                logger.warning("prune of %s keeps every blob: %s: %s", self.dir, cid, e)
                return None
            if data is None or not cid.matches(data):
                logger.warning("prune of %s keeps every blob: %s is unreadable", self.dir, cid)
                return None
            try:
                needed |= mf.blobs(mf.decode(data))
            except mf.ManifestError as e:
                logger.warning("prune of %s keeps every blob: %s: %s", self.dir, cid, e)
                return None
        return needed

    # --- carried blobs (``checkpoints.carry``) ----------------------------------------

    def _retire(self, dfd: int, bfd: int, names: list[str], needed: set[str] | None = None) -> None:
        """Before the manifest files ``names`` go (or are replaced): each blob they carry
        intact (and ``needed`` names, when given) synced in ``blobs/``, its file written
        again from the carrier where it is missing or not those bytes."""
        fds: list[int] = []
        try:
            for name in names:
                try:
                    st = os.lstat(name, dir_fd=dfd)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_size < carry.FOOTER.size:
                    continue
                try:
                    data = self._read(name, str(self.dir / name), blob=False)
                except CheckpointCopyError:
                    continue  # nothing can be saved from it
                for sha, blob in (carry.intact(data) if data is not None else {}).items():
                    if needed is None or sha in needed:
                        fds.append(self._blob_file(dfd, bfd, sha, blob))
            if fds:
                fsync_all(fds)
                os.fsync(bfd)
        finally:
            for fd in fds:
                os.close(fd)

    def _blob_file(self, dfd: int, bfd: int, sha: str, blob: bytes) -> int:
        """An open descriptor of ``blobs/<sha>`` holding ``blob`` (written again through a
        temporary when it does not), for its fsync."""
        with contextlib.suppress(OSError):
            fd = os.open(sha, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK, dir_fd=bfd)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode) and read_all(fd) == blob:
                    return fd
            except OSError:
                pass
            os.close(fd)
        fd, tmp = self._tmp(dfd)
        try:
            write_all(fd, blob)
            self._install(dfd, tmp, bfd, sha)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        return fd

    def _from_carrier(self, sha: str) -> tuple[bytes, str] | None:
        """Blob ``sha`` intact from a manifest file that carries it, and that file's name."""
        try:
            dfd = os.open(self.dir, _DIR)
        except OSError:
            return None
        try:
            names = [f"{c}{c.suffix}" for c in sorted(self.ids(), reverse=True)]
            return carry.find(dfd, names, sha)
        finally:
            os.close(dfd)

    # --- the directory -------------------------------------------------------------------

    def _open_dirs(self) -> tuple[int, int]:
        """File descriptors of the directory and its ``blobs`` (made if missing)."""
        dfd = self._open_dir(os.fspath(self.dir), None)
        try:
            return dfd, self._open_dir(BLOBS, dfd)
        except BaseException:
            os.close(dfd)
            raise

    def _open_dir(self, path: str, parent: int | None) -> int:
        for _ in range(3):
            try:
                return os.open(path, _DIR, dir_fd=parent)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(path, 0o700, dir_fd=parent)
                    if self.owner is not None:
                        os.chown(path, *self.owner, dir_fd=parent, follow_symlinks=False)
                    if parent is None:
                        _sync_dir(Path(path).parent)
                    else:
                        os.fsync(parent)  # its name durable before anything goes in it
            except (NotADirectoryError, OSError) as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP) or not (
                    self.in_space or parent is not None
                ):
                    raise CheckpointCopyError(f"{self.dir}/{path}: {e.strerror}") from None
                os.unlink(path, dir_fd=parent)  # a symlink or file planted at our name
        raise CheckpointCopyError(f"{self.dir}: {path} keeps changing")

    def _tmp(self, dfd: int) -> tuple[int, str]:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | NOFOLLOW
        for _ in range(5):
            name = f".tmp-{os.urandom(8).hex()}"
            with contextlib.suppress(FileExistsError):
                fd = os.open(name, flags, 0o600, dir_fd=dfd)
                if self.owner is not None:
                    os.fchown(fd, *self.owner)
                return fd, name
        raise CheckpointCopyError(f"{self.dir}: no temporary name free")

    @staticmethod
    def _install(sfd: int, tmp: str, dfd: int, name: str) -> None:
        """Rename ``tmp`` over ``name``: a directory planted there is removed first (a
        rename would fail on it); a symlink there is replaced itself, never followed."""
        try:
            os.replace(tmp, name, src_dir_fd=sfd, dst_dir_fd=dfd)
        except (IsADirectoryError, OSError) as e:
            if e.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise
            _remove_tree(name, dfd)
            os.replace(tmp, name, src_dir_fd=sfd, dst_dir_fd=dfd)

    def _read(self, name: str, where: str, *, blob: bool) -> bytes | None:
        """The bytes of ``name`` (in ``blobs`` when ``blob``); None when it (or the
        directory) is not there. Changes nothing, follows nothing."""
        fds: list[int] = []
        try:
            try:
                fds.append(os.open(self.dir, _DIR))
                if blob:
                    fds.append(os.open(BLOBS, _DIR, dir_fd=fds[0]))
                st = os.lstat(name, dir_fd=fds[-1])
            except FileNotFoundError:
                return None
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointCopyError(f"{where} is {_kind(st.st_mode)}, not a regular file")
            try:
                fds.append(os.open(name, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK, dir_fd=fds[-1]))
            except FileNotFoundError:
                return None
            if not stat.S_ISREG(os.fstat(fds[-1]).st_mode):  # swapped since the lstat
                raise CheckpointCopyError(f"{where} is not a regular file")
            return read_all(fds[-1])
        except OSError as e:
            raise CheckpointCopyError(f"{where}: unreadable: {e.strerror}") from None
        finally:
            for fd in fds:
                os.close(fd)

    def _lock(self, dfd: int, how: int) -> int:
        fd = os.open(".lock", os.O_RDWR | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK, 0o600, dir_fd=dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CheckpointCopyError(f"{self.dir}/.lock is not a regular file")
            fcntl.flock(fd, how)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _generation(dfd: int) -> int:
        try:
            fd = os.open(".generation", os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        except OSError:
            return 0
        try:
            return int(os.read(fd, 32).strip() or b"0")
        except (OSError, ValueError):
            return -1  # unreadable: never equal to what a writer remembered
        finally:
            os.close(fd)

    def _bump_generation(self, dfd: int) -> None:
        fd, tmp = self._tmp(dfd)
        try:
            write_all(fd, str(max(0, self._generation(dfd)) + 1).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._install(dfd, tmp, dfd, ".generation")
        os.fsync(dfd)


def _sync_dir(path: Path) -> None:
    """fsync a directory (a name made in it durable); what cannot be is left."""
    with contextlib.suppress(OSError):
        fd = os.open(path, _DIR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _blob_name(sha: str) -> str:
    if not isinstance(sha, str) or not mf.BLOB_NAME.fullmatch(sha):
        raise CheckpointCopyError(f"not a blob id: {str(sha)[:80]!r}")
    return sha


def _remove_tree(name: str, dfd: int) -> None:
    try:
        fd = os.open(name, _DIR, dir_fd=dfd)
    except OSError:
        os.unlink(name, dir_fd=dfd)
        return
    try:
        for child in os.listdir(fd):
            _remove_tree(child, fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)
