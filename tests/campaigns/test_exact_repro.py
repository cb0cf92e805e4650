"""A failing seed fails again: faults at logical points, realized interleavings as data,
exact replays, lab errors apart from failures, and the determinism figure. Real
coordinated sessions on the local backend."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from durable_spaces.campaigns.determinism import Determinism, run_determinism
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.replay import differences, exact_spec, reproduction, signature
from durable_spaces.campaigns.run import POINTS, run_one
from durable_spaces.campaigns.spec import BEHAVIOUR_ENV, CampaignSpec, RunSpec, recorded_env
from durable_spaces.campaigns.summary import Summary
from durable_spaces.chaos.schedule import AttemptPlan, PointFault, Schedule, SpaceFault

pytestmark = pytest.mark.slow


def _spec(tmp: Path, seed: str, schedule: Schedule | None, calls: int = 4) -> RunSpec:
    return RunSpec(
        run_id=f"r-{seed}",
        seed=seed,
        mode="transactional",
        backend="local",
        calls=calls,
        durable_mode="transactional",
        state_dir=str(tmp / seed),
        schedule=schedule,
    )


def test_a_fault_at_a_logical_point_lands_exactly_there(tmp_path: Path) -> None:
    """A daemon kill at the 2nd start mark and a removal at the 50th logical hit (after
    the first calls made the Space): the driver stops at each, the fault lands while it
    waits, and the record says where."""
    sched = Schedule(
        "lp1",
        (
            AttemptPlan(
                at_points=(
                    PointFault("adapter.start_mark", 2, "daemon_kill"),
                    PointFault("*", 50, "space_remove"),
                )
            ),
        ),
        "manual",
    )
    rec = asyncio.run(run_one(_spec(tmp_path, "lp1", sched)))
    assert rec.outcome == "ok", rec.checks
    landed = [(r["kind"], r["at"].get("point"), r["at"].get("n"), r["type"])
              for r in rec.extra["interleaving"]]  # fmt: skip
    assert ("daemon_kill", "adapter.start_mark", 2, "ok") in landed
    assert ("space_remove", "*", 50, "ok") in landed
    assert rec.faults.get("space_remove") == 1 and rec.recoveries.get("reimaged")


def test_a_fault_whose_point_never_comes_is_cancelled_and_recorded(tmp_path: Path) -> None:
    sched = Schedule("lp2", (AttemptPlan(at_points=(PointFault("*", 99999, "daemon_kill"),)),))
    rec = asyncio.run(run_one(_spec(tmp_path, "lp2", sched)))
    assert rec.outcome == "ok"
    (only,) = rec.extra["interleaving"]
    assert (only["kind"], only["type"], only["at"]["n"]) == ("daemon_kill", "cancelled", 99999)
    assert "daemon_kill" not in rec.faults, "a fault that did not land was counted"


def test_exact_schedule_puts_each_landed_fault_where_it_landed() -> None:
    drawn = Schedule(
        "x",
        (AttemptPlan(kill_after_s=(0.4,), faults=(SpaceFault("space_restart", at_s=0.2),)),),
    )
    realized = [
        {"attempt": 0, "epoch": 1, "kind": "space_restart", "type": "ok",
         "at": {"after_s": 0.21, "point": "adapter.spawn", "n": 1, "g": 7}, "value": {}},
        {"attempt": 0, "epoch": 1, "kind": "kill", "type": "ok",
         "at": {"after_s": 0.41, "point": "adapter.exit", "n": 1, "g": 9}, "value": {}},
        {"attempt": 1, "epoch": 2, "kind": "daemon_kill", "type": "ok",
         "at": {"trigger": "after_kill"}, "value": {}},
        {"attempt": 1, "epoch": 2, "kind": "space_remove", "type": "cancelled",
         "at": {"point": "*", "n": 40}, "value": {}},
    ]  # fmt: skip
    exact = Schedule.exact("x", drawn, realized)
    a0, a1 = exact.plan(0), exact.plan(1)
    assert a0.kill_after_s == () and a0.faults == ()  # nothing left to the clock
    assert [(p.point, p.n, p.kind) for p in a0.at_points] == [
        ("adapter.spawn", 1, "space_restart"),
        ("adapter.exit", 1, "kill"),
    ]
    assert [(f.kind, f.trigger) for f in a1.faults] == [("daemon_kill", "after_kill")]
    assert a1.at_points == ()  # the cancelled removal is not planned
    assert Schedule.from_json(exact.to_json()) == exact


def test_the_rerun_exited_mutant_reproduces_exactly_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure injected on purpose: the record's exact replay fails again each time,
    with the same interleaving; without the mutant the same replay passes."""
    monkeypatch.setenv("DS_MUTANTS", "rerun_exited")
    sched = Schedule("mx", (AttemptPlan(at_points=(PointFault("adapter.exit", 1, "kill"),)),))
    original = asyncio.run(run_one(_spec(tmp_path, "mx", sched, calls=3)))
    assert original.outcome == "failed", original.checks
    replays = [
        asyncio.run(run_one(exact_spec(original, str(tmp_path / f"exact{k}"), f"e{k}")))
        for k in range(3)
    ]
    rep = reproduction(original, replays)
    assert rep.reproduced == 3, rep
    assert all(not differences(original, r) for r in replays)
    monkeypatch.delenv("DS_MUTANTS")


def _repro_exact(record: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in BEHAVIOUR_ENV}
    return subprocess.run(
        [sys.executable, "-m", "durable_spaces.cli", "repro", "--exact", str(record),
         "--state-dir", str(cwd / f"replay-{record.stem}")],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_a_record_replays_with_the_switches_and_mutants_it_ran_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variables that choose a run's code paths are in its record and its repro
    line: an exact replay takes them on from the record, from a shell that has none (a
    mutant's failure fails again there; the same record without them passes), and a
    record whose environment is not one a run writes is refused, naming it."""
    monkeypatch.setenv("DS_MUTANTS", "rerun_exited")
    monkeypatch.setenv("DS_HOST_SCAN", "0")
    sched = Schedule("mv", (AttemptPlan(at_points=(PointFault("adapter.exit", 1, "kill"),)),))
    original = asyncio.run(run_one(_spec(tmp_path, "mv", sched, calls=3)))
    monkeypatch.delenv("DS_MUTANTS")
    monkeypatch.delenv("DS_HOST_SCAN")
    assert original.outcome == "failed", original.checks
    # the whole recorded configuration, defaults included; the repro line what is not
    ran_with = {"DS_HOST_SCAN": "0", "DS_MUTANTS": "rerun_exited"}
    assert original.extra["env"] == recorded_env(ran_with)
    assert original.extra["env"]["DS_SPACE_JOURNAL"] == "1" and set(BEHAVIOUR_ENV) - set(
        original.extra["env"]
    ) == {"DS_MICROVM_ACCEL"}  # unset: chosen on the machine
    assert original.repro.startswith(
        "env DS_HOST_SCAN=0 DS_MUTANTS=rerun_exited durable-spaces repro "
    )
    records = tmp_path / "records"
    records.mkdir()

    def variant(name: str, env: object) -> Path:
        d = original.to_json()
        d["extra"]["env"] = env
        path = records / f"{name}.json"
        path.write_text(json.dumps(d))
        return path

    again = _repro_exact(variant("as-run", original.extra["env"]), tmp_path)
    assert again.returncode == 1, again.stdout[-2000:] + again.stderr[-2000:]
    told = next(ln for ln in again.stderr.splitlines() if "environment of the record" in ln)
    assert " DS_HOST_SCAN=0 " in told and told.endswith(" DS_MUTANTS=rerun_exited"), told
    assert "outcome=failed" in again.stdout
    fixed = _repro_exact(variant("without", {}), tmp_path)
    assert fixed.returncode == 0, fixed.stdout[-2000:] + fixed.stderr[-2000:]
    for name, env, says in [
        ("path", {"PATH": "/tmp/evil"}, "'PATH' is not one of"),
        ("switch", {"DS_HOST_SCAN": "off"}, "DS_HOST_SCAN='off'"),
        ("shell", {"DS_MUTANTS": "x;rm -rf /"}, "is not a plain value"),
        ("list", ["DS_HOST_SCAN=0"], "not a mapping"),
    ]:
        bad = _repro_exact(variant(name, env), tmp_path)
        assert bad.returncode == 2, (name, bad.stdout[-500:], bad.stderr[-500:])
        assert says in bad.stderr, (name, bad.stderr[-500:])


def test_logical_schedules_go_the_same_way_twice(tmp_path: Path) -> None:
    """The determinism figure for logical-point schedules (no random-time kills)."""
    d, out = _determinism(tmp_path / "det", "det", 3, calls=4, profile="logical")
    assert d.seeds == 3 and d.same == 3, _both_ways(tmp_path / "det", d.differences)
    assert out.startswith("DETERMINISM seeds=3 same=3 fraction=1.000")


def test_a_seed_whose_runs_parted_is_named_with_where_and_its_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_spaces.campaigns import determinism

    monkeypatch.setattr(determinism, "differences", lambda a, b: ["#2: recovery x | recovery y"])
    d, out = _determinism(tmp_path / "det", "prt", 1, calls=2, profile="calm")
    assert d.same == 0
    lines = out.splitlines()
    assert lines[0].startswith("DETERMINISM seeds=1 same=0 fraction=0.000")
    assert lines[1].startswith("PARTED run-0000: #2: recovery x | recovery y (")
    assert (tmp_path / "det" / "runs" / "run-0000.a.json").exists()
    assert str(tmp_path / "det" / "runs" / "run-0000") in lines[1]


def _determinism(
    out: Path, seed_base: str, seeds: int, *, calls: int, profile: str
) -> tuple[Determinism, str]:
    """``--determinism`` on local, transactional: its result and what it printed."""
    spec = CampaignSpec(
        mode="transactional", backend="local", seed_base=seed_base, runs=1, calls=calls,
        jobs=2, profile=profile,
    )  # fmt: skip
    printed = io.StringIO()
    d = run_determinism(
        spec, "durable_spaces.campaigns.run:run_one", seeds, out_dir=out, stdout=printed
    )
    return d, printed.getvalue()


def _both_ways(out: Path, parted: dict[str, list[str]]) -> str:
    """What each twin of a seed that parted did, attempt by attempt: its exits, its
    faults and where they landed, its recoveries (the message is all a CI log keeps)."""
    lines = [repr(parted)]
    for run in parted:
        for twin in ("a", "b"):
            f = out / "runs" / f"{run}.{twin}.json"
            extra = RunRecord.from_json(json.loads(f.read_text())).extra if f.exists() else {}
            faults = [(i.get("attempt"), i.get("kind"), i.get("at")) for i in extra.get(
                "interleaving", [])]  # fmt: skip
            lines.append(
                f"{run}.{twin}: exits={extra.get('exit_codes')} faults={faults} "
                f"recoveries={extra.get('recovery_sequence')}"
            )
    return "\n".join(lines)


def test_lab_errors_are_counted_apart_from_failures() -> None:
    def rec(i: int, outcome: str) -> RunRecord:
        return RunRecord(f"run-{i}", f"s-{i}", "transactional", "local", 3, outcome=outcome)

    s = Summary.of(
        [rec(0, "ok"), rec(1, "failed"), rec(2, "lab_error")],
        mode="transactional",
        backend="local",
        seed_base="s",
    )
    assert (s.runs, s.ok, s.failed, s.lab_errors) == (3, 1, 1, 1)
    assert " failed=1 lab_errors=1 " in s.line()
    old = RunRecord.from_json({**rec(3, "ok").to_json(), "outcome": "error"})
    assert old.outcome == "lab_error"  # records written before the split still read


def test_signature_and_differences_name_where_two_runs_parted() -> None:
    base = RunRecord("run-0", "s", "transactional", "local", 3)
    a = RunRecord.from_json(base.to_json())
    b = RunRecord.from_json(base.to_json())
    a.extra = {
        "interleaving": [
            {"attempt": 0, "kind": "kill", "type": "ok", "at": {"point": "adapter.exit", "n": 1}}
        ],
        "exit_codes": [-9, 0],
    }
    b.extra = {
        "interleaving": [
            {"attempt": 0, "kind": "kill", "type": "ok", "at": {"point": "adapter.exit", "n": 2}}
        ],
        "exit_codes": [-9, 0],
    }
    assert signature(a) != signature(b)
    (diff,) = differences(a, b)
    assert "adapter.exit/1" in diff and "adapter.exit/2" in diff
    assert differences(a, a) == []
    # a fault that never came is not part of what happened: its exact replay (which has
    # no such fault) went the same way
    c = RunRecord.from_json(a.to_json())
    c.extra = {**a.extra, "interleaving": [*a.extra["interleaving"], {
        "attempt": 1, "kind": "space_restart", "type": "cancelled",
        "at": {"point": "adapter.outcome_commit", "n": 3}}]}  # fmt: skip
    assert differences(c, a) == [] and differences(a, c) == []

    # the exact replay's stop records where the driver was (``landed``): at the point
    # itself it is the same kill the original took there without a stop; elsewhere, the
    # fault slipped
    def landed_at(point: str, n: int) -> RunRecord:
        r = RunRecord.from_json(a.to_json())
        at = {"point": "adapter.exit", "n": 1, "landed": [point, n]}
        r.extra = {**a.extra, "interleaving": [{**a.extra["interleaving"][0], "at": at}]}
        return r

    assert differences(a, landed_at("adapter.exit", 1)) == []
    (slipped,) = differences(a, landed_at("adapter.exit", 2))
    assert "landed/adapter.exit/2" in slipped
    assert POINTS  # the campaign's point list is what schedules draw from


def test_the_reproduced_line_says_whether_the_replays_went_the_same_way() -> None:
    base = RunRecord("run-0", "s", "checkpoint", "local", 3)
    base.outcome = "failed"
    base.extra = {"interleaving": [], "exit_codes": [0]}
    passed = RunRecord.from_json(base.to_json())
    passed.outcome = "ok"
    other = RunRecord.from_json(passed.to_json())
    other.extra = {"interleaving": [], "exit_codes": [-9, 0]}
    same = reproduction(base, [passed, passed]).line()
    assert same.startswith("REPRODUCED run-0 0/2") and "same interleaving" in same
    differ = reproduction(base, [passed, other]).line()
    assert "the interleavings differ" in differ
    assert reproduction(base, [base, other]).line() == "REPRODUCED run-0 1/2"
