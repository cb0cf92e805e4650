"""Named fault profiles: the probabilities and ranges a run's schedule is drawn with."""

from __future__ import annotations

from dataclasses import dataclass, replace

from durable_spaces.errors import ConfigError


@dataclass(frozen=True)
class Profile:
    """Probabilities and ranges a schedule is drawn with (per faulty attempt)."""

    p_failpoint: float = 0.6
    p_random_kill: float = 0.3
    kill_delay_s: tuple[float, float] = (0.05, 1.5)
    p_daemon_kill: float = 0.1
    p_space_restart: float = 0.1
    p_space_remove: float = 0.05
    #: Probability that a drawn Space fault waits for the driver kill instead of a time.
    p_after_kill: float = 0.5
    fault_delay_s: tuple[float, float] = (0.05, 1.5)
    #: Attempts that may carry faults; later ones are clean so the run can finish.
    faulty_attempts: int = 4
    #: A drawn failpoint pauses the driver there instead of killing it.
    p_pause_failpoint: float = 0.0
    #: A timed pause of the driver (SIGSTOP) in an attempt.
    p_pause: float = 0.0
    #: A pause comes with a takeover (the next epoch launched while it sleeps).
    p_takeover: float = 0.8
    #: SIGCONT this long after the next driver's first step (or after the pause).
    resume_s: tuple[float, float] = (0.0, 2.0)
    #: The whole Space frozen for a while.
    p_space_pause: float = 0.0
    space_pause_s: tuple[float, float] = (0.2, 2.0)
    #: Where pauses and Space faults land: "logical" (at a point of the run's trace, the
    #: default: a replay puts them in the same place) or "timed" (seconds after launch).
    #: Random kills stay timed: they are the in-between moments no trace names.
    placement: str = "logical"
    #: Failpoints drawn only among points a run passes a fixed number of times (never
    #: one hit from a timer, ``points.TIMED``), so a run goes the same way twice.
    fixed_failpoints: bool = False
    #: A power loss of the whole host (``chaos/faults.py``); a profile with it runs on a
    #: powerfs mount (``campaigns/power.py``).
    p_power_loss: float = 0.0
    #: A power loss tears the last unsynced write of each file (drawn per cut).
    p_tear: float = 0.5
    #: The log's SQLite ``synchronous`` level the drivers open it with (None: the default);
    #: for a JSONL log ``OFF`` means no fsync per commit (``drive/entry.py``).
    log_synchronous: str | None = None
    #: The drivers' log: ``sqlite`` or ``jsonl`` (``DS_LOG_FORMAT``).
    log_format: str = "sqlite"
    #: A stall of the host's disk (``chaos/powerfs/disk.py``): the driver stuck inside a
    #: durability call for ``disk_stall_s``, taken over meanwhile with ``p_takeover``.
    p_disk_stall: float = 0.0
    disk_stall_s: tuple[float, float] = (0.3, 2.0)
    #: Every durability call of the host's disk delayed by a latency drawn per run
    #: (milliseconds; None: no latency).
    fsync_latency_ms: tuple[float, float] | None = None
    #: The change journal's helper in the Space killed (``journal_kill.JournalKiller``; a
    #: backend whose Spaces run it: ``spec.JOURNAL_BACKENDS``).
    p_journal_kill: float = 0.0
    #: After a stall with a takeover, a power loss soon after the next driver's launch:
    #: the cut comes while the stall still holds the old driver's call.
    p_cut_in_stall: float = 0.0
    #: The log's storage alone loses its unsynced tail (``chaos/faults.py``); a profile
    #: with it keeps the log on a powerfs mount of its own (``campaigns/log_loss.py``).
    p_log_loss: float = 0.0
    #: Before a driver's launch the log's dirty pages are written back (as a kernel does
    #: after a while): a later cut keeps that older prefix of the log and drops the rest.
    p_log_writeback: float = 0.0

    @property
    def power(self) -> bool:
        """Whether runs of this profile need a host on powerfs: one that can lose power,
        or whose disk is slow or stalls."""
        return self.p_power_loss > 0 or self.p_disk_stall > 0 or bool(self.fsync_latency_ms)

    @property
    def log_mount(self) -> bool:
        """Whether runs of this profile keep the log alone on a powerfs mount (the Space
        and everything else on the ordinary disk)."""
        return self.p_log_loss > 0 and not self.power

    def p_fault(self, kind: str) -> float:
        return {
            "daemon_kill": self.p_daemon_kill,
            "space_restart": self.p_space_restart,
            "space_remove": self.p_space_remove,
            "space_pause": self.p_space_pause,
            "power_loss": self.p_power_loss,
            "disk_stall": self.p_disk_stall,
            "journal_kill": self.p_journal_kill,
            "log_loss": self.p_log_loss,
        }[kind]


_POWER = Profile(
    p_failpoint=0.4,
    p_random_kill=0.2,
    p_daemon_kill=0.0,
    p_space_restart=0.0,
    p_space_remove=0.0,
    p_power_loss=0.7,
    p_after_kill=0.3,
    faulty_attempts=3,
    log_synchronous="FULL",
)

_SPACE = Profile(p_daemon_kill=0.3, p_space_restart=0.3, p_space_remove=0.2, p_space_pause=0.15)

#: Named profiles (``CampaignSpec.profile``).
PROFILES: dict[str, Profile] = {
    "default": Profile(),
    # as default, with pauses and Space faults at seconds after the launch (the lab's
    # placement before faults had logical positions; not exactly replayable)
    "timed": Profile(placement="timed"),
    # every fault at a logical point (no random-time kills): what --determinism measures.
    # Failpoints only where a run passes a fixed number of times; pauses never taken over
    # (the stale driver is continued seconds after its successor's first step: a time).
    "logical": Profile(
        p_random_kill=0.0,
        p_failpoint=0.7,
        p_space_restart=0.2,
        p_pause=0.2,
        p_takeover=0.0,
        fixed_failpoints=True,
    ),
    # driver kills only (failpoints and random times): the transactional/checkpoint core
    "kills": Profile(p_daemon_kill=0.0, p_space_restart=0.0, p_space_remove=0.0),
    # only failpoints, one per attempt: deterministic kill points
    "failpoints": Profile(
        p_failpoint=0.8,
        p_random_kill=0.0,
        p_daemon_kill=0.0,
        p_space_restart=0.0,
        p_space_remove=0.0,
    ),
    # Space faults more often (daemon kills, machine restarts, lost Spaces, frozen machines)
    "space": _SPACE,
    # As "space", and the change journal's helper in the Space killed under the driver
    # (a microvm's Space runs it; spacesd's and docker's with DS_HOST_SCAN=0)
    "space-journal": replace(
        _SPACE, p_daemon_kill=0.2, p_space_restart=0.2, p_space_remove=0.1, p_journal_kill=0.6
    ),
    # Paused drivers: at failpoints and at random times, most taken over while they sleep
    # and continued after the newer driver started (the stale writer), plus frozen Spaces.
    "pause": Profile(
        p_failpoint=0.7,
        p_pause_failpoint=0.6,
        p_random_kill=0.2,
        p_pause=0.4,
        p_daemon_kill=0.05,
        p_space_restart=0.05,
        p_space_remove=0.05,
        p_space_pause=0.2,
    ),
    # Power losses of the host (every process killed, unsynced writes dropped or torn),
    # between driver kills, with the log at SQLite FULL ("power") or NORMAL.
    "power": _POWER,
    "power-normal": replace(_POWER, log_synchronous="NORMAL"),
    # ... with a JSONL log, an fsync per commit or none
    "power-jsonl": replace(_POWER, log_format="jsonl"),
    "power-jsonl-nofsync": replace(_POWER, log_format="jsonl", log_synchronous="OFF"),
    # A slow disk: stalls of the host's disk with the driver stuck inside a durability
    # call (a log commit, a ledger append, a checkpoint write), most taken over while it
    # is stuck and racing its successor when the disk comes back; a per-run fsync
    # latency; driver kills, and a few power losses (some while a stall holds calls).
    "slow-disk": replace(
        _POWER,
        p_failpoint=0.3,
        p_random_kill=0.15,
        p_power_loss=0.15,
        p_disk_stall=0.8,
        disk_stall_s=(0.3, 2.0),
        resume_s=(0.0, 1.0),
        fsync_latency_ms=(0.0, 15.0),
        p_cut_in_stall=0.2,
    ),
    # The log's storage alone loses its unsynced tail (SQLite NORMAL on a mount of its
    # own), mostly right after a driver kill; the Space and its host go on, the same boot.
    "log-loss": Profile(
        p_failpoint=0.5,
        p_random_kill=0.3,
        p_daemon_kill=0.0,
        p_space_restart=0.0,
        p_space_remove=0.0,
        p_log_loss=0.7,
        p_log_writeback=0.5,
        p_after_kill=0.7,
        faulty_attempts=3,
        log_synchronous="NORMAL",
    ),
    # nothing goes wrong: a baseline run
    "calm": Profile(
        p_failpoint=0.0,
        p_random_kill=0.0,
        p_daemon_kill=0.0,
        p_space_restart=0.0,
        p_space_remove=0.0,
        faulty_attempts=0,
    ),
}


def profile_named(name: str) -> Profile:
    """The named profile; ``ConfigError`` naming the choices otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"unknown campaign profile {name!r} (choose from {', '.join(sorted(PROFILES))})"
        ) from None
