"""The Space protocol: what the adapter needs from a sandbox, and nothing more.

A Space is a named sandbox (files and processes) reached through a daemon with an exec
ledger and an epoch fence. Every backend (``durable_spaces.backends.<name>``) implements
``SpaceBackend`` (create / find / restart / delete named Spaces) and ``Space`` (what runs
inside one). The contract each method states must hold on every backend; the conformance
suite in ``tests/conformance`` checks it.

Paths given to file operations are workspace-relative POSIX paths (an absolute path is
accepted only when it lies under ``Space.root``). ``confine`` is the lexical half of the
check, shared by every backend; each backend adds the symlink half, because only it can
look at the filesystem.
"""

from __future__ import annotations

import enum
import posixpath
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from durable_spaces.errors import PathEscapeError, UnsupportedNameError

#: How much output the ledger keeps per command for replay (the daemon's figure).
OUTPUT_TAIL_BYTES = 64 * 1024

#: Capability a Space must report before the adapter will use it.
EXEC_LEDGER = "process.exec_ledger"


class ExecState(enum.Enum):
    """What the Space's ledger knows about an idempotency key."""

    UNKNOWN = "unknown"  # never started under this key
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"  # the daemon/machine stopped while it ran: outcome unknown


@dataclass(frozen=True)
class ExecRecord:
    """The ledger's record of one key."""

    key: str
    state: ExecState
    epoch: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    output_tail: bytes = b""


@dataclass(frozen=True)
class ExecResult:
    """How a command ended. ``output`` is stdout and stderr interleaved as produced.

    ``replayed``: the key had already exited, nothing ran, this is the recorded outcome.
    ``reattached``: the key was running; this call waited for that same process.
    ``output_bytes``: how much output there was in all (more than ``len(output)`` when a
    ``keep_output`` bound dropped the middle).
    """

    key: str | None
    exit_code: int | None
    signal: int | None = None
    output: bytes = b""
    replayed: bool = False
    reattached: bool = False
    output_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def omitted(self) -> int:
        """Bytes of output not kept."""
        return 0 if self.output_bytes is None else max(0, self.output_bytes - len(self.output))


class BoundedOutput:
    """A command's output, kept to at most ``cap`` bytes (its head and its tail, where the
    start and the end of a log usually matter) while every byte is counted: a command
    that prints 100 MB must cost neither 100 MB of memory nor of log. ``cap`` None keeps
    everything (helpers that parse their output: scans, tars)."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = cap
        self.total = 0
        self._head = bytearray()
        self._tail = bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.cap is None:
            self._head += chunk
            return
        room = self.cap // 4 - len(self._head)  # a quarter for the head, the rest the tail
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            keep = self.cap - len(self._head)
            if len(self._tail) > keep:
                del self._tail[: len(self._tail) - keep]

    def value(self) -> bytes:
        kept = len(self._head) + len(self._tail)
        if self.total <= kept:
            return bytes(self._head + self._tail)
        marker = f"\n[... {self.total - kept} bytes of output omitted ...]\n".encode()
        return bytes(self._head) + marker + bytes(self._tail)


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


@dataclass(frozen=True)
class FileStat:
    """``lstat`` of a path in the workspace (symlinks are not followed)."""

    path: str
    kind: str  # "file" | "dir" | "symlink" | "other"
    mode: int  # permission bits only (0o777 mask)
    size: int
    mtime_ns: int = 0
    target: str | None = None  # for symlinks


@dataclass(frozen=True)
class PathEntry:
    """One row of the workspace's path table: what the transactional image stores.

    A scan also reports what the image cannot hold, as kind ``"unsupported"`` with the
    reason in ``target`` (a name with a backslash or newline, a directory deeper than
    ``MAX_SCAN_DEPTH``): the image refuses such a table (``ImageLimits.violation``), auto
    mode switches to checkpoints for it, and a revert removes it. Raising instead would
    wedge every later call of a workspace a command made unrepresentable."""

    kind: str  # "file" | "symlink" | "unsupported"
    mode: int = 0o644
    size: int = 0
    sha256: str | None = None  # files
    target: str | None = None  # symlinks

    def to_json(self) -> dict[str, object]:
        if self.kind == "symlink":
            return {"kind": "symlink", "target": self.target}
        return {"kind": "file", "mode": self.mode, "size": self.size, "sha256": self.sha256}

    @staticmethod
    def from_json(d: Mapping[str, object]) -> PathEntry:
        if d["kind"] == "symlink":
            return PathEntry(kind="symlink", mode=0o777, target=str(d["target"]))
        return PathEntry(
            kind="file",
            mode=int(d["mode"]),  # type: ignore[call-overload]
            size=int(d["size"]),  # type: ignore[call-overload]
            sha256=str(d["sha256"]),
        )


#: A path table: workspace-relative path -> entry. Directories are implied.
PathTable = dict[str, PathEntry]


@dataclass(frozen=True)
class Capabilities:
    """What a Space can do. ``kind`` is e.g. "local", "process", "container", "microvm"."""

    kind: str
    exec_ledger: bool
    machine_checkpoints: bool = False
    features: frozenset[str] = field(default_factory=frozenset)


OutputCallback = Callable[[bytes], None]


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
    ) -> Execution:
        """Start ``argv`` under idempotency ``key`` (recorded durably before the process
        starts). A key already running is reattached; one already exited is replayed;
        neither runs again. ``key=None`` runs without the ledger (scans, tar).
        ``keep_output`` bounds what ``wait()`` returns (``BoundedOutput``); None keeps all.
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
    """Creates, finds, restarts and deletes named Spaces of one kind."""

    kind: str

    async def create(self, name: str) -> Space:
        """Create a new, empty Space (its ledger and epoch floor start empty / at 0).
        If one already exists under ``name``, return it (create is idempotent)."""
        ...

    async def find(self, name: str) -> Space | None:
        """The existing Space, reachable, or None when it does not exist."""
        ...

    async def restart(self, name: str) -> None:
        """Restart the Space's machine: every process in it dies; running ledger records
        read back ``LOST``; files, finished records and the epoch floor survive."""
        ...

    async def kill_daemon(self, name: str) -> None:
        """Kill the Space's daemon the way a crash would (SIGKILL), then bring it back.
        Whether commands survive is the backend's documented property."""
        ...

    async def delete(self, name: str) -> None:
        """Remove the Space and everything in it. Missing is not an error."""
        ...

    async def names(self) -> list[str]:
        """Names of the Spaces this backend holds (only its own)."""
        ...

    async def close(self) -> None: ...


_NAME_RE = re.compile(r"[^a-z0-9-]+")


def space_name(conversation_id: str, prefix: str = "ds") -> str:
    """A Space name derived from a conversation id: lowercase, ``[a-z0-9-]``, <= 63 chars,
    stable (the same conversation always maps to the same name)."""
    import hashlib

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


#: Directory levels a scan descends; below, a tree is one ``unsupported`` entry.
MAX_SCAN_DEPTH = 128


def name_problem(rel: str) -> str | None:
    """Why the image cannot represent the name ``rel``, or None."""
    if "\\" in rel or "\n" in rel:
        return "a backslash or newline in the name"
    return None


def unsupported(reason: str) -> PathEntry:
    return PathEntry(kind="unsupported", mode=0, target=reason)


def check_name(rel: str) -> None:
    """Refuse names the image cannot represent."""
    why = name_problem(rel)
    if why is not None:
        raise UnsupportedNameError(f"unsupported file name ({why}): {rel!r}")
