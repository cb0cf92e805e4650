"""The coordinator: re-drives one durable session, one driver process per epoch.

Three modules, one idea each: ``state`` (the durable state file and epoch issuance),
``driver`` (one driver's launch, attempt and supervision), ``loop`` (the re-drive loop:
``Coordinator``). Everything public is importable from here.

Prior art: the reference's lab coordinator (cua-spaces-cluster sessions) and any job
supervisor with backoff. What it must guarantee, even when it is itself SIGKILLed:

- Exactly one driver per epoch. The next epoch is ``max(last issued, fenced floor seen) +
  1`` and is written to ``<state_dir>/coordinator.json`` (under an ``fcntl`` lock on
  ``coordinator.lock``, written to a temporary file, fsynced, renamed, directory fsynced)
  *before* the driver is spawned. A coordinator killed between the write and the spawn
  burns that epoch; its successor never issues it again.
- Restarting. A new coordinator on the same state dir resumes from the file. A driver
  recorded there that is still alive (same pid and process start time) while the
  coordinator that recorded it is dead is an orphan: by default it is SIGKILLed and waited
  for before the next epoch starts (``kill_orphans=True``), because nobody reads its
  output any more (it would die on its next write to the dead coordinator's pipe anyway);
  with ``kill_orphans=False`` it is left for the epoch fence to stop (exit 75), which is
  what a ``stale`` campaign wants. A driver of a coordinator that is still alive is never
  killed. A driver spawned but not yet recorded when its coordinator died is unknown to
  the successor and is always left to the fence.
- Exit codes: 0 done, 78 failed (permanent), 75 fenced: the process is ignored and the
  next epoch is launched without backoff, past any ``floor`` its ``{"event": "fenced",
  "floor": N}`` line named. Anything else (including -9) is a crash: resume after
  ``backoff`` (``initial * factor**k``, capped at ``max``, ``k`` = crashes so far minus
  one). After any exit but 0 and 78, if the file shows a newer epoch whose driver is
  alive and belongs to another coordinator (even one in this process), this one stops
  with ``superseded`` instead of fighting it.
- A driver whose stdout falls silent for ``stall_secs`` (heartbeats are output) is
  SIGKILLed and counts as a crash.
- ``abandon_current()`` gives up on the running driver *without* killing it: what a
  coordinator does when it believes a driver dead that is only paused (a GC pause, a
  frozen VM, a partition). The next epoch is launched as after a crash; the abandoned
  process is still reaped when it exits (its exit code lands on its ``Attempt``), and
  ``run()`` waits for abandoned drivers before it returns, so no stale driver is left
  running behind a finished session. Whoever paused it must continue it.
- ``place_space()`` raising ``PermanentFailure`` ends the session ``failed``; any other
  error is retried like a crash (backoff, counted against ``max_attempts``).

Order of one attempt: backoff, issue the epoch, ``before_launch`` hooks (they may edit
the environment, e.g. arm a failpoint, or inflict a Space fault), ``place_space()``, spawn,
record the pid. The driver's environment is the coordinator's without ``DS_FAILPOINTS`` /
``DS_FAILPOINT_TRACE`` (a hook or ``env`` sets them explicitly), plus ``CUA_SESSION_*``.
"""

from durable_spaces.campaigns.coordinator.driver import EXIT_ABANDONED, Attempt, Launch
from durable_spaces.campaigns.coordinator.loop import (
    Coordinator,
    CoordinatorResult,
    EventCallback,
    Hook,
    Resume,
)
from durable_spaces.campaigns.coordinator.state import LOCK_FILE, STATE_FILE, read_state

__all__ = [
    "EXIT_ABANDONED",
    "LOCK_FILE",
    "STATE_FILE",
    "Attempt",
    "Coordinator",
    "CoordinatorResult",
    "EventCallback",
    "Hook",
    "Launch",
    "Resume",
    "read_state",
]
