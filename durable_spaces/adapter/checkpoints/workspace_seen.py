"""What a checkpoint taker (``incremental.Taker``) knows of one Space instance's
workspace between its checkpoints (``Seen``), where this host reads that workspace
(``Where``), and the two host reads it needs besides a walk: whether a Space's ``root``
is the workspace as this host sees it (``probe_host``), and one file's bytes
(``read_host``)."""

from __future__ import annotations

import os
import posixpath
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.batch import read_all
from durable_spaces.adapter.checkpoints.copy_watch import BlobNames
from durable_spaces.adapter.checkpoints.kept_tree import KeptTree
from durable_spaces.adapter.checkpoints.manifest_build import Builder
from durable_spaces.adapter.checkpoints.workspace_tree import TreeChanged, TreeNode, host_dir
from durable_spaces.host.holders import Holders
from durable_spaces.space import HostView, JournaledSpace, Space, WorkspaceJournal

__all__ = ["Seen", "Where", "copy_dir", "probe_host", "read_host"]


@dataclass
class Seen:
    """What this process knows of one Space instance's workspace."""

    host: bool | None = None  # the workspace is a directory here (None: not probed yet)
    #: path -> (node, sha): through commands, the files a stat key can vouch for; on the
    #: host, every file of the last listing (``clock_ns`` says which keys vouch).
    files: dict[str, tuple[TreeNode, str]] = field(default_factory=dict)
    generation: int | None = None  # of the store, when ``files`` was filled
    since_ns: int | None = None  # commands: the clock of the last listing, less RACY_NS
    clock_ns: int = 0  # host: the clock of the last listing
    copy_blobs: BlobNames = field(default_factory=BlobNames)  # host: the copy's blobs
    holders: Holders | None = None  # host: who holds the workspace's files
    kept: KeptTree | None = None  # host: the last listing, kept by a journal
    journal_pause: int = 0  # host: full walks left before a journal is tried again
    #: This workspace's manifest memos (per Space instance: two Spaces' checkpoints may
    #: run at once, each under its own lock), and whether their last build was finished.
    builder: Builder = field(default_factory=Builder)
    encoder: mf.Encoder = field(default_factory=mf.Encoder)
    built: bool = False
    #: A view of the workspace from this host at another path (``space.HostView``: a
    #: container's), once asked for (``viewed``), and where its walks read it.
    view: HostView | None = None
    viewed: bool = False
    where: Where | None = None

    def drop_kept(self) -> None:
        if self.kept is not None:
            self.kept.close()
            self.kept = None

    def drop_view(self) -> None:
        self.drop_kept()
        if self.view is not None:
            self.view.close()
        self.view, self.where = None, None

    def close(self) -> None:
        self.copy_blobs.close()
        self.drop_view()


@dataclass
class Where:
    """Where this host reads a workspace: at ``root`` now, at ``fresh()`` for a full walk
    (a path found again then: a container's workspace, ``space.HostView``), watched by
    ``journal()`` (None: no journal)."""

    root: str
    fresh: Callable[[], str]
    journal: Callable[[], WorkspaceJournal | None]
    #: Where this host writes the Space's copy of its checkpoints, and the owner (uid,
    #: gid) its files must have (None: this process's).
    copy: Callable[[], tuple[str, tuple[int, int] | None]]

    @staticmethod
    def of(space: Space) -> Where:
        """A Space whose ``root`` is the workspace as this host sees it."""

        def journal() -> WorkspaceJournal | None:
            return space.workspace_journal() if isinstance(space, JournaledSpace) else None

        return Where(space.root, lambda: space.root, journal, lambda: (copy_dir(space), None))


def copy_dir(space: Space) -> str:
    """Where a Space keeps its own copies: beside the workspace, not in it."""
    return posixpath.join(posixpath.dirname(space.root.rstrip("/")), ".ds-checkpoints")


def read_host(root: str, path: str) -> bytes:
    """A workspace file's bytes, every directory opened without following links."""
    *dirs, name = path.split("/")
    try:
        with host_dir(root, dirs) as fd:
            f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError as e:
        raise TreeChanged(f"{path!r}: {e.strerror}") from None
    try:
        return read_all(f)
    finally:
        os.close(f)


async def probe_host(space: Space, epoch: int) -> bool:
    """Whether ``space.root`` is the workspace as this host sees it: a random token
    written beside it through the Space must read back here."""
    if not os.path.isdir(space.root):
        return False
    d = copy_dir(space)
    token = os.urandom(16).hex()
    name = f".probe-{token}"
    q = shlex.quote
    res = await space.exec(
        [
            "bash",
            "-c",
            f'd={q(d)}; if [ -L "$d" ] || {{ [ -e "$d" ] && [ ! -d "$d" ]; }}; then '
            f'rm -f -- "$d"; fi; mkdir -p -- "$d" && printf %s {token} > "$d/{name}"',
        ],
        key=None,
        epoch=epoch,
        cwd="/",
    )
    if res.exit_code != 0:
        return False
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        try:
            ok = os.read(f, 64) == token.encode()
        finally:
            os.close(f)
        os.unlink(name, dir_fd=fd)
        return ok
    except OSError:
        return False
    finally:
        os.close(fd)
