"""Power losses: the host's state on powerfs, the ``power_loss`` fault and what the
checker names after it (``campaigns/power.py``, ``checks/power.py``)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from needs import need

from durable_spaces.campaigns.checks.power import power_losses
from durable_spaces.campaigns.power import killed_in_commit
from durable_spaces.campaigns.spec import CampaignSpec, RunSpec
from durable_spaces.chaos.faults import Failpoint, PointFault, SpaceFault
from durable_spaces.chaos.powerfs import mount
from durable_spaces.chaos.profiles import PROFILES
from durable_spaces.chaos.schedule import AttemptPlan, Schedule
from durable_spaces.drive.coordinator_state import StateFile, read_state
from durable_spaces.drive.supervisor import Attempt
from durable_spaces.errors import ConfigError

needs_fuse = pytest.mark.fuse  # skipped without FUSE, failed on CI (tests/needs.py)

POINTS = ["adapter.call", "adapter.start_mark", "adapter.outcome_commit"]


def test_power_profiles_draw_power_losses_and_others_never_do() -> None:
    power = [Schedule.draw(f"p-{i}", POINTS, 6, "power") for i in range(50)]
    kinds = {f.kind for s in power for a in s.attempts for f in a.faults}
    kinds |= {p.kind for s in power for a in s.attempts for p in a.at_points}
    assert "power_loss" in kinds
    for name, prof in PROFILES.items():
        if prof.power:
            continue
        drawn = [Schedule.draw(f"p-{i}", POINTS, 6, name) for i in range(50)]
        assert "power_loss" not in {k for s in drawn for k in s.planned_faults()}, (
            f"profile {name} drew a power loss"
        )
    assert PROFILES["power"].log_synchronous == "FULL"
    assert PROFILES["power-normal"].log_synchronous == "NORMAL"


def test_power_profiles_refuse_backends_off_the_mount() -> None:
    with pytest.raises(ConfigError, match="local or spacesd only"):
        CampaignSpec(mode="transactional", backend="docker", profile="power")
    CampaignSpec(mode="transactional", backend="spacesd", profile="power")


@needs_fuse
def test_a_spacesd_space_record_survives_a_power_loss(tmp_path: Path) -> None:
    """The daemon's state file, token and directories are synced when the Space is laid
    out: after a cut the host still knows its Space (and boots its daemon again)."""
    from durable_spaces.backends.spacesd.daemon import PGROUP, LocalDaemon

    (tmp_path / "disk" / "spaces").mkdir(parents=True)
    (tmp_path / "host").mkdir()
    fs = mount(tmp_path / "disk", tmp_path / "host")
    try:
        d = LocalDaemon(tmp_path / "host" / "spaces" / "s", Path("/bin/false"), PGROUP, "127.0.0.1")
        st = d.init()
        fs.cut(tear=True)
        back = d.read_state()
        assert back is not None and back.instance_id == st.instance_id
        assert d.token() and d.data.is_dir() and d.work.is_dir()
    finally:
        fs.unmount()


def test_a_full_log_that_lost_commits_fails_and_a_normal_one_is_named() -> None:
    cut = {"lost_commits": 3, "commits_after": 7, "space_ahead": True}
    full = power_losses([cut], "FULL")
    assert full["valid"] is False
    assert [a["name"] for a in full["anomalies"]] == ["log_rolled_back"]
    normal = power_losses([cut], "NORMAL")
    assert normal["valid"] is True
    assert "log_rolled_back: 1" in normal["detail"] and "space_ahead: 1" in normal["detail"]
    kept = power_losses([{"lost_commits": 0, "space_ahead": False}], "FULL")
    assert kept["valid"] is True and "nothing lost" in kept["detail"]
    assert power_losses([cut], "FULL", "jsonl")["valid"] is False  # an fsync per commit
    unsynced = power_losses([cut], "OFF", "jsonl")
    assert unsynced["valid"] is True and "JSONL no fsync" in unsynced["detail"]


@needs_fuse
@pytest.mark.parametrize("fsync", [True, False])
def test_a_jsonl_commit_survives_a_power_loss_only_with_its_fsync(
    tmp_path: Path, fsync: bool
) -> None:
    from durable_spaces.campaigns.checks.rawlog import read_log
    from durable_spaces.harness.log import open_fenced_jsonl

    (tmp_path / "disk" / "session").mkdir(parents=True)
    (tmp_path / "host").mkdir()
    fs = mount(tmp_path / "disk", tmp_path / "host")
    try:
        log = tmp_path / "host" / "session" / "log.jsonl"
        storage, _ = open_fenced_jsonl(log, 1, fsync=fsync)
        try:
            storage.append([])
            storage.append([])
        finally:
            storage.close()
        fs.cut()
        assert len(read_log(log).commits) == (2 if fsync else 0)
    finally:
        fs.unmount()


@needs_fuse
def test_issued_epochs_survive_a_power_loss(tmp_path: Path) -> None:
    """The coordinator's file is synced (file, rename, directory) before a driver runs
    under the epoch: a cut never gives an old epoch out again."""
    (tmp_path / "disk" / "session").mkdir(parents=True)
    (tmp_path / "host").mkdir()
    fs = mount(tmp_path / "disk", tmp_path / "host")
    try:
        state = StateFile(tmp_path / "host" / "session", "s", "c1")
        assert [state.issue(0, False, lambda e, p: None) for _ in range(3)] == [1, 2, 3]
        fs.cut(tear=True)
        assert read_state(tmp_path / "host" / "session")["last_epoch"] == 3
        assert (
            StateFile(tmp_path / "host" / "session", "s", "c2").issue(0, False, lambda e, p: None)
            == 4
        )
    finally:
        fs.unmount()


@needs_fuse
@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "profile", "seed", "backend"),
    [
        ("transactional", "power", "pt-1", "local"),
        ("checkpoint", "power-normal", "pt-8", "local"),
        ("transactional", "power", "pt-1", "spacesd"),
        ("transactional", "power-jsonl", "pt-1", "local"),
        ("transactional", "power-jsonl-nofsync", "pt-1", "local"),
    ],
)
def test_a_power_run_is_consistent(
    tmp_path: Path, mode: str, profile: str, seed: str, backend: str
) -> None:
    """One campaign run of a power profile: the power goes at least once, the run is
    consistent, and the cut's observation is in the record (the daemon's own ledger
    read on spacesd, the JSONL log's commits counted)."""
    from durable_spaces.campaigns.run import run_one

    need(backend)
    run = RunSpec(
        run_id="run-0000",
        seed=seed,
        mode=mode,
        backend=backend,
        calls=5,
        durable_mode=mode,
        state_dir=str(tmp_path / "run"),
        profile=profile,
    )
    rec = asyncio.run(run_one(run))
    assert rec.faults.get("power_loss", 0) >= 1, rec.faults
    assert rec.outcome == "ok", {k: v["detail"] for k, v in rec.checks.items() if not v["valid"]}
    assert rec.checks["power_losses"]["valid"] is True
    cuts = rec.extra["power"]
    assert cuts and all("lost_commits" in c for c in cuts)
    assert all(c["commits_before"] is not None for c in cuts)  # the log was read
    assert any(c["after"]["ledger_epoch"] is not None for c in cuts)  # so was the ledger
    assert not (tmp_path / "run" / "host").is_mount()  # unmounted after the run


def test_the_host_reads_a_jsonl_logs_floor_from_its_markers(tmp_path: Path) -> None:
    """A JSONL log's fence is its marker files: the host's look at it must see the floor
    there (else every cut would read as ``space_ahead``)."""
    from durable_spaces.campaigns.power import look
    from durable_spaces.harness.log import open_fenced_jsonl

    log = tmp_path / "log.jsonl"
    storage, _ = open_fenced_jsonl(log, 3)
    try:
        storage.append([])
    finally:
        storage.close()
    (tmp_path / "epoch").write_text("3\n")
    seen_now = look(log, tmp_path / "ledger.jsonl", tmp_path / "epoch")
    assert (seen_now["commits"], seen_now["log_epoch"], seen_now["log_floor"]) == (1, 3, 3)


_COMMITTER = """
import sys
from durable_spaces.chaos import failpoints
from durable_spaces.harness.log_sqlite import SqliteStorage
failpoints.arm({sys.argv[2]: (2, "stop")}, trace=sys.argv[3])
log = SqliteStorage(sys.argv[1], synchronous="FULL")
log.append([{"op": "one"}])
log.append([{"op": "two"}])  # stops at its second hit of the armed point
"""


@pytest.mark.parametrize("stop_at", ["log.before_commit", "log.after_commit"])
def test_a_driver_killed_inside_a_commit_is_one_commit_in_flight(
    tmp_path: Path, stop_at: str
) -> None:
    """A driver SIGKILLed between ``log.before_commit`` and ``log.after_commit`` may have
    written its commit into the WAL (a reader before the cut sees it) while its fsync
    never returned: unacknowledged, so a cut that takes it is no rollback of a durable
    log. (CI's ``ci-pcp-0`` was failed for such a commit: killed by a random kill inside
    it, the power cut right after.) One killed after its commit returned has none."""
    trace = tmp_path / "trace"
    child = subprocess.Popen(
        [sys.executable, "-c", _COMMITTER, str(tmp_path / "log.sqlite"), stop_at, str(trace)]
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _stopped(child.pid):
            assert child.poll() is None, "the committer exited before its stop"
            time.sleep(0.01)
        assert _stopped(child.pid), "the committer never stopped at its point"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    attempt = Attempt(0, 1, child.pid, 0.0, process=None, trace=str(trace))  # type: ignore[arg-type]
    inside = killed_in_commit([attempt])
    assert inside == (1 if stop_at == "log.before_commit" else 0)
    assert killed_in_commit([Attempt(1, 2, 1, 0.0, process=None)]) == 0  # type: ignore[arg-type]
    # what the check makes of one commit lost at such a cut
    cut = {"lost_commits": 1, "in_flight_commits": inside, "commits_after": 1}
    assert power_losses([cut], "FULL")["valid"] is (stop_at == "log.before_commit")


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


@needs_fuse
@pytest.mark.parametrize("how", ["after_kill", "at_point"])
def test_a_cut_counts_the_commit_its_killed_driver_was_inside(tmp_path: Path, how: str) -> None:
    """The power goes while the driver is inside its 6th log commit: killed there by its
    failpoint, the cut right after (``after_kill``), or the cut itself landing there
    (``at_point``, which kills it). Either way the cut counts that commit in flight,
    and the run (FULL) is consistent."""
    from durable_spaces.campaigns.run import run_one

    if how == "after_kill":
        first = AttemptPlan(
            failpoint=Failpoint("log.before_commit", 6),
            faults=(SpaceFault("power_loss", trigger="after_kill"),),
        )
    else:
        first = AttemptPlan(at_points=(PointFault("log.before_commit", 6, "power_loss"),))
    seed = f"pif-{how}"
    spec = RunSpec(
        run_id="run-0000",
        seed=seed,
        mode="checkpoint",
        backend="local",
        calls=3,
        durable_mode="checkpoint",
        state_dir=str(tmp_path / "run"),  # short: powerfs binds a socket under it
        schedule=Schedule(seed, (first,), "manual"),
        profile="power",
    )
    rec = asyncio.run(run_one(spec))
    assert rec.outcome == "ok", {k: v["detail"] for k, v in rec.checks.items() if not v["valid"]}
    (cut,) = rec.extra["power"]
    assert cut["in_flight_commits"] == 1, cut
