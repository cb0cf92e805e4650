"""Every exception durable-spaces raises, in one place.

The split that matters: a *command failure* is data (an exit status in a tool result),
while everything here is about the machinery (log, fence, Space) and must never be
turned into a tool result by accident.
"""

from __future__ import annotations


class DurableSpacesError(Exception):
    """Base class of every error this package raises on purpose."""


class StaleEpochError(DurableSpacesError):
    """A writer carried an epoch below the floor of the log, the Space or the stream.

    Raised through wrapped tools, never recorded as a tool result: a driver that sees it
    must stop (exit 75).
    """

    def __init__(self, epoch: int, floor: int, where: str = "") -> None:
        self.epoch = epoch
        self.floor = floor
        self.where = where
        at = f" ({where})" if where else ""
        super().__init__(f"epoch {epoch} is older than the current epoch {floor}{at}")


class FenceHaltedError(StaleEpochError):
    """The fence was halted by the driver's halt path; every later commit is refused."""

    def __init__(self, where: str = "") -> None:
        at = f" ({where})" if where else ""
        DurableSpacesError.__init__(self, f"the log's fence is halted{at}")
        self.epoch = -1
        self.floor = -1
        self.where = where


# --- the durable log -------------------------------------------------------------------


class LogError(DurableSpacesError):
    """The durable log cannot be used as asked."""


class CorruptLogError(LogError):
    """A stored log is damaged somewhere other than a torn last line."""


class StorageLockedError(LogError):
    """Another process already owns this storage (one owner at a time)."""


class ForeignDatabaseError(LogError):
    """The file at a log path is another program's SQLite database; it is left untouched."""


# --- Spaces ----------------------------------------------------------------------------


class SpaceError(DurableSpacesError):
    """Something about a Space itself, as opposed to a command that ran in it."""


class SpaceUnavailableError(SpaceError):
    """The Space cannot be reached right now (daemon down, machine restarting)."""


class SpaceGoneError(SpaceUnavailableError):
    """The Space does not exist any more (removed, or its machine is gone for good)."""


class PathEscapeError(SpaceError, ValueError):
    """A path would leave the workspace (``..``, an absolute path, or a symlink)."""


class UnsupportedNameError(SpaceError, ValueError):
    """A file name the image cannot represent (a backslash or a newline)."""


class CapabilityMissingError(SpaceError):
    """The Space lacks a capability durable-spaces needs (e.g. ``process.exec_ledger``)."""


class BackendUnavailableError(SpaceError):
    """A backend cannot run on this machine (no Docker, no QEMU, no binary)."""


# --- the adapter and the driver ---------------------------------------------------------


class ToolArgumentError(DurableSpacesError, ValueError):
    """A wrapped tool was called with arguments it cannot take (missing, wrong type, out
    of range): the model sees it as the tool's error; nothing ran."""


class PermanentFailure(DurableSpacesError):
    """Retrying cannot help: the driver exits 78 and the coordinator stops."""


class CheckpointError(PermanentFailure):
    """A recorded checkpoint cannot be used. Never a tool's result: the driver exits 78."""


class BadCheckpointIdError(CheckpointError, ValueError):
    """A checkpoint id (read back from the log, a store or a Space) is malformed: it is
    never used as a file name or a shell word. From the log: the log is damaged."""

    def __init__(self, value: object, where: str, why: str = "malformed") -> None:
        shown = repr(value)
        if len(shown) > 80:
            shown = f"{shown[:60]}...{shown[-12:]} ({len(shown)} characters)"
        super().__init__(f"{where}: {why} checkpoint id {shown}")
        self.value = value
        self.where = where


class CheckpointCopyError(CheckpointError):
    """One copy of a checkpoint is unusable (a symlink or directory in its place, not
    readable, bytes that do not match its id). A restore passes over it for the next
    copy; only if it escapes a caller does it stop the driver."""


class CheckpointCorruptError(CheckpointError):
    """No intact copy of a checkpoint exists: ``problems`` says, per copy (the store, a
    Space), what was wrong with it (a digest mismatch, a refused archive, tar failing)."""

    def __init__(self, checkpoint_id: str, problems: list[str]) -> None:
        super().__init__(f"no intact copy of checkpoint {checkpoint_id}: " + "; ".join(problems))
        self.checkpoint_id = checkpoint_id
        self.problems = problems


class SpaceOwnedError(PermanentFailure):
    """The Space is another log's (or its owner record cannot be trusted): nothing was
    changed; ``DS_SPACE_ADOPT`` takes it (``adapter/space_owner.py``)."""


class HaltError(DurableSpacesError):
    """The driver must stop without recording anything (the Space cannot be fenced).

    ``permanent`` is true when retrying cannot help (a missing capability): exit 78;
    otherwise the driver exits 1 and is resumed.
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class ImageLimitError(DurableSpacesError):
    """The workspace is over the transactional image's limits."""


class ReviewError(DurableSpacesError):
    """The workspace as of an entry cannot be read (no such entry, a machine checkpoint,
    or a checkpoint gone from both the store and its Space)."""


class BadFileError(DurableSpacesError, ValueError):
    """A file read from outside (named by a user, or by a record or state file) is not
    what it must be: not a regular file (a FIFO, a device), too big, nested too deep, or
    not the format asked for. One line naming the file; nothing was changed
    (``durable_spaces/host/bounded.py``)."""


class ConfigError(DurableSpacesError, ValueError):
    """A malformed environment or option; names the variable and what was wrong."""


# --- the cluster store (durable_spaces/cluster) ---------------------------------------


class ClusterError(DurableSpacesError):
    """The cluster's shared state (PostgreSQL) refused a transition or could not be used."""


class ClusterUnavailableError(ClusterError):
    """PostgreSQL could not be reached (or kept failing) for longer than the store's bound."""


class ClusterConflictError(ClusterError):
    """The transition conflicts with what is stored: placing a generation that is not the
    one waiting, a run id queued again with another spec, a schema newer than this code."""


class UnknownRecordError(ClusterError, LookupError):
    """No host, durable space, session or run of that name is stored."""


class LeaseLostError(ClusterError):
    """A lease token that is not the space's current one (superseded by a newer
    acquisition, released, or another session's): the drive holding it must stop."""

    def __init__(self, space: str, session: str, token: int, current: int, why: str) -> None:
        self.space = space
        self.session = session
        self.token = token
        self.current = current
        super().__init__(
            f"lease token {token} of session {session} on space {space} is refused: {why}"
        )


class ClaimLostError(ClusterError):
    """A coordinator's claim on a session, or a worker's on a run, is no longer its own
    (taken over after it lapsed, or the record is finished)."""


class HostLostError(ClusterError):
    """The host was declared lost (its heartbeat was too old); its Spaces are being placed
    elsewhere. Its agent must drop what it provided and register again."""


class HostApiError(ClusterError):
    """A host agent did not answer (down, unreachable, timed out) or could not serve the
    request now: the caller tries again later or another host."""


class HostAuthError(ClusterError):
    """A host API request without the cluster's host secret's signature (or with a wrong
    one): the host refuses it (401) before doing anything."""


class NetnsError(DurableSpacesError):
    """A network namespace, bridge or veth of a test host could not be made or removed."""


class DatabaseServerError(DurableSpacesError):
    """The private PostgreSQL server could not be initialised, started or stopped."""


# --- the chaos lab -----------------------------------------------------------------------


class RecordError(DurableSpacesError, ValueError):
    """A run record file is not a record: not JSON, the wrong shape, a field of the wrong
    type. Names the file and the field; a report skips such a file and counts it."""


class LooseModeWarning(UserWarning):
    """A log file or directory of ours was readable by others; its mode was tightened."""


class TornTailWarning(UserWarning):
    """A JSONL log ended in a torn line (a crash mid-append); it is ignored, then truncated."""
