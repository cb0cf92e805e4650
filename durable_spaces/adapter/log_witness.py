"""The Space ahead of the log, seen without the boot id: the log's position in the ledger.

A log's storage can lose its unsynced tail while the Space keeps every effect (SQLite
``NORMAL`` or a JSONL log without fsync on a mount that lost power: a shared mount, or
another host in the many-hosts layout). The host that runs the Space never rebooted, so
its boot id (``machine.py``) says nothing: the next driver saw the Space's effects of the
calls the log forgot as changes made outside the calls, and ran those calls again.

The witness. The ``cua.space`` document counts the start marks it ever committed (its
*position*, ``SpaceState.marks``; every start mark takes the next one). Before a call's
effect may touch the Space, the Space's exec ledger holds the key of its position,
``<log identity>:<conversation>#<position>``: a bash call's command runs under that key
(it is its exec key, recorded durably before the process starts: nothing more to do), a
write or edit
first records it with a ``true`` run under it (fenced by the epoch, as every mutation).
A driver binding to a Space it found (not one it just created) asks the ledger once for
the position after the log's last: known means the Space saw a start mark of this
conversation that the log no longer has, so effects the log does not have may be in
it. Then, as after a power loss, the workspace goes back to what the log implies
(transactional: the image; checkpoint: the newest checkpoint the log names; a log that
lost every call implies an empty workspace), the calls in flight are unknown, and the
positions the ledger already knows are skipped (a key is never used twice, whatever
either side lost). A ``log_behind`` recovery event says so; what the take-back deletes
that nothing else holds is kept first (``quarantine.py``). The key names the log by its
identity (``Storage.identity``), which is durable from the log's creation, before its
first commit (a SQLite log in WAL mode at ``NORMAL`` that was never checkpointed loses
every commit at once, never its identity): a log that starts again from nothing on a
Space whose ledger knows its positions is behind, not new; a new log (even one at a
deleted log's path) has another identity, so it is never taken for one that lost its
tail, and two logs never share a key. A Space knows its log too: ``space_owner.py``.

Why one probe suffices: positions are used in order, and a driver records each one's key
before it commits the next start mark (or dies). A driver killed between a start mark
and its effect leaves a gap, so every driver, when it binds, makes sure the log's last
position is known to the ledger (a filler key, ``<key>.kept``, never an exec key: the
call's own key must still read back as never started). So if any effect of a position
beyond what the log kept reached the Space, the position right after the log's last is
known. A Space placed again starts an empty ledger, and the same rule holds from the
position its first driver found in the log. A whole machine restored from a checkpoint
(``MachineCheckpoints``) has its ledger as of the checkpoint: the positions the log has
since are filled in right after (a few: the calls since that checkpoint).

Why this and not the alternatives:

- *Keys the log never recorded, found by listing the ledger* would need a listing the
  Space protocol does not have (``exec_record`` answers one key), and sees bash calls
  only: a lost write or edit leaves no key; an edit run twice fails.
- *An epoch the log never issued* (the Space's floor above the log's) sees a lost driver
  start, never calls lost within one driver's epoch: the common case.
- *A random name per log in the key, made with its first commit* is lost with that
  commit: the log that lost everything would look new, and adopt the Space's effects of
  every call it forgot. The identity is that name, made durable before any commit
  instead (the log's storage writes and syncs it when it creates the log).
- *The conversation alone in the key* (an earlier form of this witness, with the
  session's name) made a new log of a reused name look behind a Space another log
  used, and revert it to nothing; and two logs of one name shared keys (one was told the
  other's output).
- *A position file the adapter writes per call* costs a mutation per call (a command on
  ``spacesd``), and a file in the workspace would be in every scan and checkpoint.
- *A position written ahead, off the call path* (reserved after one call for the next)
  cannot tell "the log lost the next start mark and the effect ran" from "the driver died
  before that start mark": whatever the Space learns before the effect and after the
  start mark's commit must be learned on the call's path. Only the effect's own request
  carries it for free, and that is a bash call's key.

So a bash call costs nothing more (its key is the mark; the probe is one ``exec_record``
per Space per driver, off the call path), and a write or edit costs one ledger record
before its effect. Sound in both modes: nothing touches the workspace for a call before
its position is in the ledger, whichever way the Space is kept.

Not seen: a ledger that lost its tail with the log (a power loss of the Space's host:
the boot id's case, ``machine.py``).
"""

from __future__ import annotations

from durable_spaces.adapter.space_state import CallRecord, SpaceState
from durable_spaces.chaos import mutants
from durable_spaces.errors import ConfigError
from durable_spaces.space import ExecState, Space

#: The filler's suffix: a position the log has whose effect never started.
_KEPT = ".kept"
#: How many of the log's last positions a restored Space's ledger is filled with at most:
#: the calls since the checkpoint it was restored to.
RESTORED_WALK = 16


def position_key(owner: str, position: int) -> str:
    """The ledger key of a start mark's position (a bash call's exec key); ``owner``
    names the log's conversation (``LogWitness.owner``)."""
    return f"{owner}#{position}"


async def record(space: Space, key: str, epoch: int) -> None:
    """Put a position into the ledger before a file tool's effect (a bash call's command
    runs under its key instead), or a filler: a ``true`` run under it, not waited for."""
    run = await space.spawn(["true"], key=key, epoch=epoch, cwd="/", new_key=True)
    await run.detach()


class LogWitness:
    """Asks the ledger once per Space and driver whether it is ahead of the log."""

    def __init__(self, log_id: str = "") -> None:
        self._asked: set[str] = set()
        #: The log's identity (``DurableSpaces.bind_log`` sets it before any Space is used).
        self.log_id = log_id

    def owner(self, conv: str) -> str:
        """Whose positions: the log (its identity, kept by a log that lost everything,
        never another log's) and the conversation."""
        if not self.log_id:
            raise ConfigError("the log's witness is used before the adapter knows its log")
        return f"{self.log_id}:{conv}"

    def next_position(self, conv: str, state: SpaceState, rec: CallRecord) -> str:
        """Give ``rec``'s new start mark the log's next position (committed with it), and
        return its key."""
        state.marks += 1
        rec.mark = state.marks
        return position_key(self.owner(conv), state.marks)

    def asked(self, name: str) -> bool:
        return name in self._asked

    @staticmethod
    async def _known(space: Space, key: str) -> bool:
        for k in (key, key + _KEPT):
            if (await space.exec_record(k)).state is not ExecState.UNKNOWN:
                return True
        return False

    async def behind(self, conv: str, state: SpaceState, space: Space) -> int | None:
        """The highest position the ledger knows beyond the log's (None: the log is not
        behind the Space). Asked once per Space by each driver."""
        self._asked.add(space.name)
        if mutants.active("log_behind_blind"):
            return None
        top, position = None, state.marks + 1
        while await self._known(space, position_key(self.owner(conv), position)):
            top, position = position, position + 1
        return top

    async def fill(
        self, conv: str, state: SpaceState, space: Space, epoch: int, walk: int = 1
    ) -> None:
        """Make sure the ledger knows the log's last position (see the module doc); with
        ``walk``, the ones before it too, down to a known one (at most ``walk``): a whole
        machine restored from a checkpoint has its ledger as of that checkpoint."""
        position = state.marks
        while position > 0 and walk > 0:
            key = position_key(self.owner(conv), position)
            if await self._known(space, key):
                return
            await record(space, key + _KEPT, epoch)
            position, walk = position - 1, walk - 1
