"""The values that cross the Space protocol (``durable_spaces.space``): ledger records,
command results and their bounded output, file stats, path tables, capabilities, and
the checks of names a path table cannot hold. Kept apart from the protocols so that the
contract reads in one page."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from durable_spaces.errors import UnsupportedNameError

#: How much output the ledger keeps per command for replay (the daemon's figure).
OUTPUT_TAIL_BYTES = 64 * 1024

#: Capability a Space must report before the adapter will use it.
EXEC_LEDGER = "process.exec_ledger"
#: A feature: an epoch advance kills every process started under an older epoch, however
#: it left its group, session or environment (a local Space's cgroup per epoch).
CONTAINED_EPOCHS = "process.contained_epochs"


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


@dataclass
class WorkspaceChanges:
    """What a change journal named since its last look (``space.WorkspaceJournal``):
    ``paths`` to look at again one by one, ``trees`` with everything below them."""

    paths: set[str] = field(default_factory=set)
    trees: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.paths or self.trees)


@dataclass(frozen=True)
class Capabilities:
    """What a Space can do. ``kind`` is e.g. "local", "process", "container", "microvm"."""

    kind: str
    exec_ledger: bool
    machine_checkpoints: bool = False
    features: frozenset[str] = field(default_factory=frozenset)
    #: Features this kind of Space has where the host allows, missing here: name -> why.
    missing: Mapping[str, str] = field(default_factory=dict, hash=False)


OutputCallback = Callable[[bytes], None]

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
