"""The durable log's data model: commits, the fence and storage protocols, and the
in-memory storage. The file-backed storages (``log_sqlite``, ``log_jsonl``) build on
these; ``durable_spaces.harness.log`` is the public face of all of them."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from durable_spaces.errors import ConfigError, CorruptLogError, FenceHaltedError, StaleEpochError
from durable_spaces.host.bounded import parse_json

LogOp = dict[str, Any]


@dataclass(frozen=True)
class Commit:
    """One stored commit: its position in the line, the epoch that wrote it, its ops."""

    seq: int
    ops: list[LogOp]
    epoch: int | None = None


@runtime_checkable
class Fence(Protocol):
    """An epoch floor shared by every writer of one log."""

    epoch: int

    def floor(self) -> int:
        """The current floor (the highest epoch that has written or raised it)."""
        ...

    def check(self) -> None:
        """Raise ``StaleEpochError`` if a newer epoch has raised the floor (or halted)."""
        ...

    def halt(self, reason: str = "") -> None:
        """Refuse every later commit of this writer (the driver's halt path)."""
        ...

    @property
    def halted(self) -> bool: ...


#: What a log's identity looks like: 32 lowercase hex digits (``Storage.identity``).
IDENTITY = re.compile(r"[0-9a-f]{32}")


def new_identity() -> str:
    """A new log's identity: random, so two logs never share one by chance."""
    return uuid.uuid4().hex


def derived_identity(*parts: bytes) -> str:
    """An identity made from what an older log already holds (a log written before logs
    had one): the same bytes always give the same identity."""
    h = hashlib.sha256(b"durable-spaces log identity")
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()[:32]


def check_identity(value: object, where: str) -> str:
    """``value`` when it is a log identity, else ``CorruptLogError`` naming ``where``: it
    becomes part of Space names and exec keys."""
    if isinstance(value, str) and IDENTITY.fullmatch(value):
        return value
    raise CorruptLogError(f"{where}: the log's identity {str(value)[:40]!r} is not 32 hex digits")


@runtime_checkable
class Storage(Protocol):
    """An append-only line of atomic commits, with an identity of its own.

    ``identity`` names this log and no other: made when the log is created and durable
    before its first commit, so no later loss of commits (a power cut of a log that
    never synced) takes it, and a new log (even at the same path) has another. The
    adapter keys its Spaces' names, exec keys and owner records by it
    (``adapter/log_witness.py``)."""

    @property
    def identity(self) -> str: ...

    def load(self) -> list[Commit]:
        """Every stored commit, in order."""
        ...

    def append(self, ops: Sequence[LogOp]) -> int:
        """Store one commit atomically and durably (per the storage's sync level);
        return its seq. A fenced storage raises ``StaleEpochError`` and stores nothing."""
        ...

    def close(self) -> None: ...


@dataclass
class MemoryFence:
    """A fence in memory (tests; several writers in one process share one floor)."""

    epoch: int
    _floor: list[int] = field(default_factory=lambda: [0])
    _halted: bool = False

    def floor(self) -> int:
        return self._floor[0]

    def check(self) -> None:
        if self._halted:
            raise FenceHaltedError("memory")
        if self._floor[0] > self.epoch:
            raise StaleEpochError(self.epoch, self._floor[0], "log")
        self._floor[0] = self.epoch

    def halt(self, reason: str = "") -> None:
        self._halted = True

    @property
    def halted(self) -> bool:
        return self._halted

    def writer(self, epoch: int) -> MemoryFence:
        """Another writer of the same log, at ``epoch``."""
        return MemoryFence(epoch, self._floor)


class MemoryStorage:
    """Commits kept in memory: for tests and transient agents; gone with the process."""

    def __init__(self, fence: Fence | None = None, identity: str | None = None) -> None:
        self._commits: list[Commit] = []
        self._lock = threading.Lock()
        self.fence = fence
        #: A memory log is lost whole with its process: a new one is a new log.
        self.identity = check_identity(identity or new_identity(), "memory log")

    def load(self) -> list[Commit]:
        with self._lock:
            return list(self._commits)

    def append(self, ops: Sequence[LogOp]) -> int:
        with self._lock:
            if self.fence is not None:
                self.fence.check()
            seq = len(self._commits) + 1
            epoch = self.fence.epoch if self.fence is not None else None
            self._commits.append(Commit(seq, [dict(o) for o in ops], epoch))
            return seq

    def close(self) -> None:
        pass


#: The largest epoch a log can hold: the SQLite fence stores it in an INTEGER (int64).
MAX_EPOCH = 2**63 - 1


def check_epoch(epoch: object, what: str = "epoch") -> int:
    """An epoch a fence can store: an int (not a bool) in 0..MAX_EPOCH."""
    if type(epoch) is not int:
        raise ConfigError(f"{what} must be an integer, not {type(epoch).__name__} {epoch!r}")
    if not 0 <= epoch <= MAX_EPOCH:
        raise ConfigError(f"{what} must be in 0..2**63-1 (SQLite's INTEGER), not {epoch}")
    return epoch


class EncodedOps(list[LogOp]):
    """Plain-JSON ops with the JSON text they were read from (``encoded``). Why: the
    harness turns every commit's ops into plain JSON by a round trip through text, and a
    file storage would then encode the same ops again (a transactional call's commit of
    its image is tens of KB: both encodings were a sixth of the call). Never changed
    after it is made, so its text is what encoding it would give."""

    text: str = ""


def encoded(ops: Sequence[LogOp]) -> EncodedOps:
    """``ops`` as plain JSON (tuples become lists, keys strings), with their text."""
    text = json.dumps(list(ops), separators=(",", ":"))
    out = EncodedOps(parse_json(text, where="a commit's ops", max_depth=None))
    out.text = text
    return out


def dumps_ops(ops: Sequence[LogOp]) -> str:
    """Serialize ops *before* anything is stored (a bad op stores nothing); the text an
    ``EncodedOps`` already has."""
    if type(ops) is EncodedOps:
        return ops.text
    return json.dumps([dict(o) for o in ops], separators=(",", ":"))
