"""The Space protocol: what the adapter needs from a sandbox, and nothing more.

A Space is a named sandbox (files and processes) reached through a daemon with an exec
ledger and an epoch fence. Every backend (``durable_spaces.backends.<name>``) implements
``SpaceBackend`` (create / find / delete named Spaces) and ``Space`` (what runs inside
one). Abilities only some callers need are protocols of their own, so no backend is
asked for what it cannot do and mypy checks each against its caller: ``Faults``
(restart, kill the daemon, pause: what the chaos lab inflicts),
``MachineCheckpoints`` (whole-machine checkpoints: what ``SandboxSnapshots`` takes),
``JournaledSpace`` (a change journal of a host workspace: what checkpoints read),
``HostWorkspace`` (a workspace that is this host's directory by construction),
``ViewedSpace`` (a workspace this host can read at another path: a container's),
``HostProcesses`` (processes this host can look at in its ``/proc``) and
``LedgerMarks`` (a ledger that records a key without running anything: ``local``).
Every protocol is runtime-checkable: a caller that needs an ability asks
``isinstance(backend, Faults)`` and refuses a backend without it with a clear error.

The contract each method states must hold on every backend that has it; the conformance
suite in ``tests/conformance`` checks it. Each backend module proves its conformance to
mypy (a ``TYPE_CHECKING`` block returning its classes as these protocols).

Paths given to file operations are workspace-relative POSIX paths (an absolute path is
accepted only when it lies under ``Space.root``). ``confine`` is the lexical half of the
check, shared by every backend; each backend adds the symlink half, because only it can
look at the filesystem. The values that cross the protocol are in
``durable_spaces.space_types`` and re-exported here.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

from durable_spaces.errors import BadCheckpointIdError, PathEscapeError
from durable_spaces.space_types import (
    CONTAINED_EPOCHS,
    EXEC_LEDGER,
    MAX_SCAN_DEPTH,
    OUTPUT_TAIL_BYTES,
    BoundedOutput,
    Capabilities,
    ExecRecord,
    ExecResult,
    ExecState,
    FileStat,
    OutputCallback,
    PathEntry,
    PathTable,
    WorkspaceChanges,
    check_name,
    name_problem,
    unsupported,
)

__all__ = [
    "CONTAINED_EPOCHS",
    "EXEC_LEDGER",
    "MAX_SCAN_DEPTH",
    "OUTPUT_TAIL_BYTES",
    "BoundedOutput",
    "Capabilities",
    "ExecRecord",
    "ExecResult",
    "ExecState",
    "Execution",
    "Faults",
    "FileStat",
    "HostProcesses",
    "HostView",
    "HostWorkspace",
    "JournaledSpace",
    "LedgerMarks",
    "MachineCheckpoints",
    "OutputCallback",
    "PathEntry",
    "PathTable",
    "Space",
    "SpaceBackend",
    "ViewedSpace",
    "WorkspaceChanges",
    "WorkspaceJournal",
    "check_name",
    "confine",
    "machine_checkpoint_id",
    "name_problem",
    "space_name",
    "unsupported",
]


class Execution(Protocol):
    """A started (or reattached, or replayed) command."""

    key: str | None
    pid: int | None
    reattached: bool
    replayed: bool

    def output(self) -> AsyncIterator[bytes]:
        """Chunks of output as they arrive (everything from the start when reattaching,
        as far as the daemon kept it). Ends when the command exits."""
        ...

    async def wait(self) -> ExecResult:
        """Wait for the end and return the result (drains ``output`` if unread)."""
        ...

    async def detach(self) -> None:
        """Stop following the command without killing it."""
        ...


@runtime_checkable
class Space(Protocol):
    """One sandbox. Every method may raise ``SpaceUnavailableError`` / ``SpaceGoneError``
    (the Space itself failed), which is never to be confused with a command's exit status.
    """

    name: str
    #: Absolute path of the workspace inside the Space (the cwd of commands by default).
    root: str
    #: Changes whenever the Space is created anew under the same name (a lost Space
    #: placed again is a different instance, with an empty workspace and ledger).
    instance_id: str

    async def capabilities(self) -> Capabilities: ...

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        key: str | None,
        epoch: int,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        keep_output: int | None = None,
        new_key: bool = False,
    ) -> Execution:
        """Start ``argv`` under idempotency ``key`` (recorded durably before the process
        starts). A key already running is reattached; one already exited is replayed;
        neither runs again. ``key=None`` runs without the ledger (scans, tar).
        ``keep_output`` bounds what ``wait()`` returns (``BoundedOutput``); None keeps all.
        ``new_key``: the caller made ``key`` new (a start mark just committed it), so a
        backend may skip reading the ledger first; the ledger must still never run a key
        twice (wrongly vouched for, it may only report a replay as a run).
        Raises ``StaleEpochError`` when ``epoch`` is below the Space's floor."""
        ...

    async def exec(
        self,
        argv: Sequence[str],
        *,
        key: str | None,
        epoch: int,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        on_output: OutputCallback | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """``spawn`` then ``wait``, forwarding output chunks to ``on_output``.
        ``stdin`` (only with ``key=None``) is fed to the process and then closed."""
        ...

    async def exec_record(self, key: str) -> ExecRecord: ...

    async def current_epoch(self) -> int: ...

    async def advance_epoch(self, epoch: int) -> None:
        """Raise the floor to ``epoch`` (no-op if equal): every process started under an
        older epoch is killed first, then older epochs are refused. Lowering raises
        ``StaleEpochError``."""
        ...

    async def read_file(self, path: str) -> bytes: ...

    async def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """The bytes of several regular files (workspace-relative, confined as
        ``read_file``), in one transfer where the Space can: path -> bytes, as of this
        Space's last scan or later (a Space may answer from what its last scan read). A
        path it cannot read so (missing, not a regular file, behind a symlink, changed
        while it was read) is left out: the caller reads it alone."""
        ...

    # Every mutation carries the caller's epoch and is refused (``StaleEpochError``,
    # nothing changed) when the Space's floor is above it, checked atomically with the
    # change: a driver paused mid-call and continued after a newer one took over can
    # never touch the workspace again. A mutation above the floor may raise it (the real
    # daemon treats a newer epoch as an advance); callers raise the floor first.

    async def write_file(
        self, path: str, data: bytes, mode: int | None = None, *, epoch: int
    ) -> None:
        """Create or replace a regular file (parents created), atomically (a crash leaves
        the old file or the new, and no temporary in the workspace). Never follows a
        symlink. ``mode`` None keeps an existing file's mode (0644 for a new one)."""
        ...

    async def symlink(self, path: str, target: str, *, epoch: int) -> None:
        """Create (or replace) a symlink at ``path``; ``target`` is stored verbatim."""
        ...

    async def stat(self, path: str) -> FileStat | None:
        """``lstat``; None when the path does not exist."""
        ...

    async def list_dir(self, path: str = ".") -> list[str]: ...

    async def remove(self, path: str, recursive: bool = False, *, epoch: int) -> None:
        """Remove a file, symlink (not its target) or, with ``recursive``, a directory.
        Missing paths are not an error."""
        ...

    async def scan(self, root: str = ".", exclude: Sequence[str] = ()) -> PathTable:
        """The workspace (under ``root``) as a path table. Re-hashes only files whose
        size, mtime, inode or ctime changed since this Space's last scan. Names the image
        cannot represent come back as ``unsupported`` entries (see ``PathEntry``); a tree
        deeper than ``MAX_SCAN_DEPTH`` is one ``unsupported`` entry at that depth."""
        ...

    async def close(self) -> None:
        """Drop connections (does not stop the Space)."""
        ...


@runtime_checkable
class SpaceBackend(Protocol):
    """Creates, finds and deletes named Spaces of one kind."""

    kind: str

    async def create(self, name: str) -> Space:
        """Create a new, empty Space (its ledger and epoch floor start empty / at 0).
        If one already exists under ``name``, return it (create is idempotent)."""
        ...

    async def find(self, name: str) -> Space | None:
        """The existing Space, reachable, or None when it does not exist."""
        ...

    async def delete(self, name: str) -> None:
        """Remove the Space and everything in it. Missing is not an error."""
        ...

    async def names(self) -> list[str]:
        """Names of the Spaces this backend holds (only its own)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class Faults(Protocol):
    """The faults the chaos lab inflicts on a named Space's machine (``SpaceNemesis``)."""

    async def restart(self, name: str) -> None:
        """Restart the Space's machine: every process in it dies; running ledger records
        read back ``LOST``; files, finished records and the epoch floor survive."""
        ...

    async def kill_daemon(self, name: str) -> None:
        """Kill the Space's daemon the way a crash would (SIGKILL), then bring it back.
        Whether commands survive is the backend's documented property."""
        ...

    async def pause(self, name: str) -> None:
        """Freeze the Space's machine (its daemon too, where it has one) until ``resume``:
        requests hang, nothing is lost."""
        ...

    async def resume(self, name: str) -> None:
        """Undo ``pause``; a Space that is not paused (or is gone) is left as it is."""
        ...


#: What a machine checkpoint id looks like (``MachineCheckpoints``): 24 lowercase hex
#: digits, so an id read back from a log can name nothing but a checkpoint.
MACHINE_CHECKPOINT_ID = re.compile(r"[0-9a-f]{24}")


def machine_checkpoint_id(value: object, where: str = "a machine checkpoint") -> str:
    """``value`` when it is a machine checkpoint id, else ``BadCheckpointIdError``."""
    if isinstance(value, str) and MACHINE_CHECKPOINT_ID.fullmatch(value):
        return value
    raise BadCheckpointIdError(value, where, "not a machine")


@runtime_checkable
class WorkspaceJournal(Protocol):
    """A change journal of a workspace that is a directory of this host: what changed
    since its last look, for a walk that watched each directory before listing it and
    each regular file before its ``lstat`` (``dir`` / ``file``; the descriptors are the
    walk's own, opened without following links). ``changes`` is None, with ``broken``
    saying why, whenever it cannot vouch for everything (then: a full walk and a new
    journal). Stores through a shared writable mapping raise no event: a caller that
    must see them looks at the files some process holds (``host.holders``)."""

    broken: str | None

    def dir(self, rel: str, fd: int) -> None: ...

    def file(self, rel: str, dir_fd: int, name: str) -> None: ...

    def forget(self, rel: str, tree: bool) -> None:
        """``rel`` (with ``tree``, all below it too) is no longer listed."""
        ...

    def is_watched_dir(self, rel: str, fd: int) -> bool:
        """Whether the directory open as ``fd`` is the one watched as ``rel``."""
        ...

    def changes(self) -> WorkspaceChanges | None: ...

    def close(self) -> None: ...


@runtime_checkable
class JournaledSpace(Protocol):
    """A Space whose workspace this host can journal (``local``; ``spacesd`` with its
    daemon on this host). Each consumer gets its own journal: watches and the queue of
    events belong to whoever looks."""

    def workspace_journal(self) -> WorkspaceJournal | None:
        """A new journal of the workspace (None: this Space cannot have one now)."""
        ...


@runtime_checkable
class HostView(Protocol):
    """A Space's workspace as this host can read it at another path than the Space's
    ``root`` (a container's, through its root filesystem), for a checkpoint's walk. Only
    reads: every change, the Space's copy of a checkpoint included, still goes through
    the Space, fenced by its epoch."""

    def open(self) -> str:
        """Find the workspace (again) and return the path to read it at; ``OSError``
        when this host cannot read it now."""
        ...

    def journal(self, root: str) -> WorkspaceJournal | None:
        """A new journal of the workspace read at ``root`` (``open``'s), which breaks when
        the workspace is no longer there (None: no journal now)."""
        ...

    def copy_at(self, directory: str) -> tuple[str, tuple[int, int]] | None:
        """Where this host writes ``directory`` (a path in the Space beside the
        workspace: its copy of its checkpoints), found where ``open`` found the
        workspace, and the (uid, gid) its files must have; None: not here."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ViewedSpace(Protocol):
    """A Space with a ``HostView`` (``docker``, where the engine shows the container's
    root filesystem here)."""

    def host_view(self) -> HostView | None:
        """A new view of the workspace from this host (None: none)."""
        ...


@runtime_checkable
class HostWorkspace(Protocol):
    """A Space whose ``root`` is this host's directory by construction (``local``: the
    backend makes it here and runs its processes here), so a checkpoint reads it here
    without first proving it through the Space (``adapter/checkpoints/incremental.py``'s probe: a
    command per driver, on each attempt's first checkpoint). A Space that only
    happens to be on this host (a daemon's, ``spacesd``) is proved instead: what it
    says of itself comes from the daemon, and a wrong claim would checkpoint another
    directory."""

    def host_workspace(self) -> bool:
        """True: ``root`` is the workspace as this host sees it."""
        ...


@runtime_checkable
class HostProcesses(Protocol):
    """A Space whose processes run on this host, each seen in this host's ``/proc`` with
    the workspace at ``root`` (``local``; a ``spacesd`` daemon started here, in a PID
    namespace of its own or not): who is left in the workspace is looked at here
    (``adapter/leftovers.py``), not by a command in the Space."""

    def host_processes(self) -> int | None:
        """None: not now (the caller runs its command in the Space); 0: the Space's
        processes are this host's, under their pids here; else the host pid of a process
        of the PID namespace they are in, whose pids name them (as a look inside would)."""
        ...


@runtime_checkable
class LedgerMarks(Protocol):
    """A Space whose exec ledger records a key without running anything (``local``: a
    line of its own ledger), where another Space runs a ``true`` under the key: what
    the log's witness (``adapter/log_witness.py``) records a file tool's position with."""

    async def ledger_mark(self, key: str, *, epoch: int) -> None:
        """Record ``key`` durably, as a command that ran and exited 0 with no output
        (``exec_record`` says so, and a later spawn under it is replayed, never run),
        fenced as a spawn: ``StaleEpochError`` when ``epoch`` is below the floor, and
        nothing recorded. A key the ledger already has is left as it is."""
        ...


@runtime_checkable
class MachineCheckpoints(Protocol):
    """Whole-machine checkpoints (memory and disk) kept by the backend, outside the
    Space: what ``SandboxSnapshots`` needs. Ids match ``MACHINE_CHECKPOINT_ID``.
    ``epoch`` fences each call against the backend's own copy of the Space's floor (a
    stale driver's call is refused with ``StaleEpochError`` and changes nothing); None is
    the backend's own, unfenced use."""

    async def checkpoint(self, name: str, epoch: int | None = None) -> str:
        """Checkpoint Space ``name``'s whole machine; returns the checkpoint's id."""
        ...

    async def restore(self, name: str, checkpoint_id: str, epoch: int | None = None) -> Space:
        """Replace Space ``name``'s machine with the checkpoint's (its processes come back
        as they were); a Space that no longer exists is placed again from it. The
        restored daemon has the checkpoint's floor: callers raise the epoch first."""
        ...

    async def fork(self, checkpoint_id: str, new_name: str) -> Space:
        """A new Space ``new_name`` running from the checkpoint; its origin is untouched."""
        ...

    async def prune_space(self, name: str, keep: set[str]) -> list[str]:
        """Delete Space ``name``'s checkpoints not in ``keep`` (never one a living Space
        was restored or forked from); returns the ids removed."""
        ...


_NAME_RE = re.compile(r"[^a-z0-9-]+")


def space_name(conversation_id: str, prefix: str = "ds") -> str:
    """A Space name derived from a conversation id: lowercase, ``[a-z0-9-]``, <= 63 chars,
    stable (the same conversation always maps to the same name)."""
    slug = _NAME_RE.sub("-", conversation_id.lower()).strip("-")[:40] or "x"
    digest = hashlib.sha256(conversation_id.encode()).hexdigest()[:10]
    return f"{prefix}-{slug}-{digest}"


def confine(root: str, path: str) -> str:
    """Lexically confine ``path`` to the workspace ``root``; return it workspace-relative
    ("." for the root itself). Refuses ``..`` escapes and absolute paths outside ``root``.
    Symlinks are the backend's half of the check."""
    if "\x00" in path:
        raise PathEscapeError(f"path contains a NUL byte: {path!r}")
    root = posixpath.normpath(root)
    if posixpath.isabs(path):
        norm = posixpath.normpath(path)
        if norm != root and not norm.startswith(root.rstrip("/") + "/"):
            raise PathEscapeError(f"absolute path outside the workspace: {path!r}")
        rel = posixpath.relpath(norm, root)
    else:
        rel = posixpath.normpath(path) if path else "."
    if rel == ".." or rel.startswith("../") or posixpath.isabs(rel):
        raise PathEscapeError(f"path escapes the workspace: {path!r}")
    return rel
