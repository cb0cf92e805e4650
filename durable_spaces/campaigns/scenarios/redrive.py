"""``redrive``: sessions re-driven through a real cluster, through one fault of seven kinds.

Each run is a cluster of its own (``campaigns/cluster/lab.py``): a private PostgreSQL, two host
agents in network namespaces providing the run's backend (local or spacesd), two
``durable-spaces coordinator`` processes and the drivers they launch. The seed draws one
fault kind (``KINDS``): the reference's five (a driver kill; a Space removed right after
a driver kill; a Space removed under a live driver; the coordinator killed in its
backoff and restarted; two sessions racing for one Space) plus a lost host and a
database restart. Every session is judged by the checker (its workspace equals its log,
every step once, no stale writer) and the run by the cluster's own checks on the
store's events (``checks/leases.py``: zero lease and epoch violations).

The run is whole here (``run_whole``; ``campaigns/run.py`` hands it over): the single-host
``Coordinator`` and nemesis every other scenario drives with are not used. Resume latency
is sampled on the ``driver_kill`` kind: from the SIGKILL to the next driver's first step
(the reaping, the backoff, ``begin_drive``, the host's answer, a cold start, recovery).
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from durable_spaces.campaigns.checker import History, check_all
from durable_spaces.campaigns.checks.effects import diagnose
from durable_spaces.campaigns.checks.leases import LeaseTally, tally
from durable_spaces.campaigns.checks.verdict import Anomaly, Verdict, anomaly
from durable_spaces.campaigns.checks.workload import interpret
from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.scenarios import registration
from durable_spaces.campaigns.scenarios.base import OneSession
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.chaos.schedule import Schedule
from durable_spaces.errors import ConfigError, LogError

#: The fault kinds, one per run, drawn from the seed.
KINDS = (
    "driver_kill",
    "remove_after_kill",
    "remove_live",
    "coordinator_kill",
    "race",
    "host_loss",
    "db_restart",
)
#: The SUMMARY fields this scenario adds (each summed over the runs' ``extra``).
SUMMARY_FIELDS = registration("redrive").summary_fields
#: The backends a namespaced host provides here (docker publishes on the root
#: namespace's loopback only; microVMs need KVM per host).
BACKENDS = ("local", "spacesd")
#: The coordinators' backoff (initial,max,factor): the first one is what a resume waits.
BACKOFF = "0.5,2,2"
#: A longer one where a coordinator is killed in it (a window wide enough to hit).
LONG_BACKOFF = "2,4,2"
SESSION_TIMEOUT_S = 150.0
#: Calls a session makes at least: long enough for a fault to land mid-session.
MIN_CALLS = 10


class LateFault(Exception):
    """The fault came after the session had ended: nothing was tested (the lab's miss)."""


class SessionStuck(Exception):
    """A session did not end in time: the system under test's failure, not the lab's."""


def _wait(what: str, fn: Callable[[], Any], timeout: float = 60.0) -> Any:
    from durable_spaces.campaigns.cluster.lab import wait_for

    return wait_for(what, fn, timeout)


class Redrive(OneSession):
    name = "redrive"

    def schedule(self, run: RunSpec) -> Schedule:
        return Schedule(run.seed, (), "drawn")  # the kind is drawn in run_whole

    async def run_whole(self, run: RunSpec, record: RunRecord) -> RunRecord:
        """The whole run, ``record`` (its identity filled in by ``run.py``) completed."""
        return await asyncio.to_thread(run_redrive, run, record)

    def checks(self) -> Mapping[str, Any]:
        return {}


def unavailable_reason(backend: str = "local") -> str | None:
    """Why a redrive run cannot run here (root and ``ip`` for the namespaces,
    PostgreSQL's binaries, cua-spacesd for spacesd hosts), or None."""
    from durable_spaces.backends.spacesd import unavailable_reason as spacesd_reason
    from durable_spaces.campaigns.cluster import netns
    from durable_spaces.cluster import pgserver

    needs = [pgserver.unavailable_reason, netns.unavailable_reason]
    if backend == "spacesd":
        needs.append(spacesd_reason)
    return next((r for r in (f() for f in needs) if r is not None), None)


def kind_of(seed: str) -> str:
    return random.Random(f"{seed}:redrive").choice(KINDS)


def run_redrive(run: RunSpec, record: RunRecord) -> RunRecord:
    """One run: its cluster up, its kind played, its sessions checked, all of it ended."""
    from durable_spaces.campaigns.cluster.lab import Cluster
    from durable_spaces.campaigns.cluster.netns import NetnsLab
    from durable_spaces.cluster.pgserver import PgServer

    t0 = time.monotonic()
    kind = kind_of(run.seed)
    root = Path(run.state_dir) / "cluster"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        if run.backend not in BACKENDS:
            raise ConfigError(
                f"the redrive scenario runs on {' or '.join(BACKENDS)} hosts, not {run.backend}"
            )
        if (why := unavailable_reason(run.backend)) is not None:
            raise ConfigError(f"the redrive scenario cannot run here: {why}")
        with PgServer() as pg, NetnsLab() as lab:
            cluster = Cluster(pg.url(), root, lab)
            try:
                play = Play(run, kind, cluster, pg)
                play.start()
                sessions = play.run()
                fill(record, play, cluster, sessions)
            finally:
                cluster.close()
        record.settle()
    except SessionStuck as e:
        record.checks = {"sessions_end": {"valid": False, "detail": str(e)}}
        record.settle()
    except Exception as e:
        record.outcome = "lab_error"
        record.checks = {"run": {"valid": None, "detail": f"{type(e).__name__}: {e}"}}
    finally:
        record.extra["kind"] = kind
        if record.outcome == "ok":
            shutil.rmtree(root / "hosts", ignore_errors=True)  # the Spaces; logs stay
        record.duration_s = round(time.monotonic() - t0, 3)
    return record


class Play:
    """One kind of fault against a running cluster; what it saw for the record."""

    def __init__(self, run: RunSpec, kind: str, cluster: Any, pg: Any) -> None:
        self.run_spec = run
        self.kind = kind
        self.cluster = cluster
        self.pg = pg
        self.rng = random.Random(f"{run.seed}:play")
        self.space = "sp1"
        self.faults: Counter[str] = Counter()
        self.kills = 0
        self.resumes: list[float] = []
        self.backoffs: list[float] = []
        self.notes: dict[str, Any] = {}
        self.coordinators: dict[str, Any] = {}

    def start(self) -> None:
        self.cluster.host("h1", self.run_spec.backend)
        self.cluster.host("h2", self.run_spec.backend)
        backoff = LONG_BACKOFF if self.kind == "coordinator_kill" else BACKOFF
        for cid in ("c1", "c2"):
            self.coordinators[cid] = self.cluster.coordinator(cid, "--backoff", backoff)

    def end(self, name: str) -> None:
        try:
            self.cluster.wait_session(name, SESSION_TIMEOUT_S)
        except TimeoutError as e:
            raise SessionStuck(f"{name}: {e} ({self.cluster.store.session(name)})") from None

    def submit(self, name: str, calls: int, sleep: float) -> None:
        mode = self.run_spec.durable_mode or "transactional"
        ckpt = self.cluster.root / "checkpoints" if mode != "transactional" else None
        seed = f"{self.run_spec.seed}-{name}"
        self.cluster.submit(name, self.space, seed, calls=calls, sleep=sleep, mode=mode,
                      checkpoint_dir=ckpt)  # fmt: skip

    def run(self) -> list[str]:
        """Play the kind; the sessions to check, in the order they drove the Space."""
        calls = self.run_spec.calls
        sleep = self.rng.choice([0.2, 0.3, 0.5])
        if self.kind == "race":
            return self.race(calls, sleep)
        # The fault must land mid-session (a Space lost once its session has ended is
        # placed again only by a next session; none here), and a call is short (only
        # shell steps sleep): at least MIN_CALLS calls.
        calls = max(calls, MIN_CALLS)
        if self.kind in ("remove_live", "host_loss", "db_restart"):
            sleep = max(sleep, 1.0)
        if self.kind == "host_loss":
            # a local Space is a directory the driver writes itself: it goes on until the
            # store declares the host lost (3 s without a heartbeat), so leave it longer
            # (a call is short: only shell steps sleep)
            calls = max(calls, 24)
        self.submit("s1", calls, sleep)
        getattr(self, self.kind)("s1")
        self.end("s1")
        return ["s1"]

    # -- the kinds ------------------------------------------------------------------------

    def _kill(self, session: str, epoch: int) -> float | None:
        """SIGKILL that driver if it still runs; when (unix ms), or None."""
        try:
            t = float(self.cluster.kill_driver(session, epoch))
        except Exception as e:  # it finished or died already
            self.notes.setdefault("kill_missed", []).append(f"{session}@{epoch}: {e}")
            return None
        self.kills += 1
        return t

    def _results(self, session: str, n: int) -> None:
        def enough() -> bool:
            try:
                return len(self.cluster.history(session).results) >= n
            except LogError:
                return False

        _wait(f"{n} results in {session}'s log", enough)

    def driver_kill(self, s: str) -> None:
        self.cluster.wait_first_step(s, 1)
        time.sleep(self.rng.uniform(0.0, 0.5))
        killed = self._kill(s, 1)
        if killed is None:
            return
        self.faults["driver_kill"] += 1

        def resumed() -> Any:
            steps = [
                e for e in self.cluster.events("driver_first_step", s) if e.detail["epoch"] == 2
            ]
            return steps or self.cluster.store.session(s).state in ("done", "failed")

        nxt = _wait(f"{s} resumed", resumed)
        if nxt is True:  # killed as it finished: the next driver had no step left
            self.notes["killed_at_the_end"] = True
            return
        self.resumes.append(float(nxt[0].detail["unix_ms"]) - killed)
        self.backoffs.append(float(BACKOFF.split(",")[0]) * 1000)

    def _remove(self) -> None:
        """An operator removes the Space's sandbox on its (live) host."""
        from durable_spaces.cluster.host import local_name

        sp = self.cluster.store.space(self.space)
        host = self.cluster.hosts[sp.host_id]
        backend = _host_backend(host)

        async def remove() -> None:
            try:
                await backend.delete(local_name(self.space, sp.generation))
            finally:
                await backend.close()

        asyncio.run(remove())
        self.notes["removed_generation"] = sp.generation

    def remove_after_kill(self, s: str) -> None:
        self._results(s, 1)
        if self._kill(s, 1) is not None:
            self._remove()
            self.faults["space_remove_after_kill"] += 1

    def remove_live(self, s: str) -> None:
        self._results(s, self.rng.randint(1, 2))
        self._remove()
        self.faults["space_remove_live"] += 1

    def coordinator_kill(self, s: str) -> None:
        self.cluster.wait_first_step(s, 1)
        if self._kill(s, 1) is None:
            return
        _wait("the killed driver reaped", lambda: self.cluster.events("driver_exited", s))
        cid = self.cluster.store.session(s).claimed_by
        proc = self.coordinators[cid]
        in_backoff = len(self.cluster.events("epoch_issued", s)) == 1
        proc.kill()
        proc.wait(10)
        self.faults["coordinator_kill"] += 1
        self.notes["coordinator_killed"] = {"id": cid, "in_backoff": in_backoff}
        self.coordinators[cid] = self.cluster.coordinator(cid, "--backoff", LONG_BACKOFF)  # same id

    def host_loss(self, s: str) -> None:
        self._results(s, 1)
        holder = self.cluster.store.space(self.space).host_id
        self.cluster.lose(holder)
        self.faults["host_loss"] += 1
        self.notes["lost_host"] = holder

    def db_restart(self, s: str) -> None:
        self._results(s, 1)
        self.pg.stop("fast")
        time.sleep(self.rng.uniform(0.3, 2.0))
        self.pg.start()
        self.faults["db_restart"] += 1
        if self.rng.random() < 0.5 and self._kill(s, 1) is not None:
            self.faults["driver_kill_after_db_restart"] += 1

    def race(self, calls: int, sleep: float) -> list[str]:
        self.submit("a", calls, max(sleep, 0.5))
        self.cluster.wait_first_step("a", 1)
        self.submit("b", max(2, calls // 2), sleep)
        _wait(
            "b pending",
            lambda: (
                self.cluster.store.session("b").reason == "held by session:a"
                or self.cluster.store.session("a").state == "done"
            ),
        )
        self.faults["race"] += 1
        if self.rng.random() < 0.5 and self._kill("a", 1) is not None:
            self.faults["driver_kill"] += 1
        self.end("a")
        self.end("b")
        return ["a", "b"]


def _host_backend(host: Any) -> Any:
    from durable_spaces.backends.local import LocalBackend
    from durable_spaces.backends.spacesd import SpacesdBackend

    if host.backend == "local":
        return LocalBackend(host.state_dir / "spaces")
    return SpacesdBackend(host.state_dir / "spaces", listen_host=host.ip)


def _session_checks(cluster: Any, sessions: list[str], space: str) -> dict[str, Verdict]:
    """The checker's verdicts. One session: all of them on its log and workspace. Two
    (a race): the Space holds the first's work, then the second's, each step once."""
    if len(sessions) == 1:
        return dict(check_all(cluster.inputs(sessions[0], space)))
    hs = [cluster.history(s) for s in sessions]
    calls = {k: v for h in hs for k, v in h.calls.items()}
    both = History([], None, calls=calls, results=[r for h in hs for r in h.results])
    inputs = cluster.inputs(sessions[-1], space)
    status = {str(r.get("call_id")): str(r.get("status")) for r in both.results}
    wrong = diagnose(interpret(both), inputs.workspace.nodes, status)
    out: dict[str, Verdict] = {
        "race_workspace_equals_logs": {
            "valid": not wrong,
            "detail": "; ".join(str(w) for w in wrong[:3]) or "both logs applied in order",
        }
    }
    verdicts = check_all(inputs)
    for k in ("log_intact", "image_equals_workspace", "no_stale_writes", "no_error_results",
              "finished"):  # fmt: skip
        out[k] = verdicts[k]
    return out


def probe_superseded(store: Any, space: str) -> list[Anomaly]:
    """Every superseded lease token of ``space`` offered again, as its stale holder
    would: to renew, connection and release. Each must be refused (and the store counts
    each refusal: ``tokens_refused``); one accepted is a lease violation."""
    from durable_spaces.errors import LeaseLostError, SpaceUnavailableError

    grants = [
        (int(e.detail["token"]), str(e.session))
        for e in store.events("lease_acquired", space=space)
    ]
    current = max((t for t, _ in grants), default=0)
    out: list[Anomaly] = []
    for token, session in grants:
        if token == current:
            continue
        ops = {"renew": store.renew_lease, "connect": store.connect, "release": store.release_lease}
        for op, fn in ops.items():
            try:
                fn(space, session, token)
            except LeaseLostError:
                continue
            except SpaceUnavailableError:  # a connect that got past the token check
                pass
            detail = f"{op} with superseded token {token} of {session} accepted (current {current})"
            out.append(anomaly("stale_token_accepted", detail, witness=[token]))
    return out


def fill(record: RunRecord, play: Play, cluster: Any, sessions: list[str]) -> None:
    stale = probe_superseded(cluster.store, play.space)
    events = cluster.events()
    t: LeaseTally = tally(events)
    t.lease.extend(stale)
    checks: dict[str, Any] = {}
    for s in sessions:
        got = cluster.store.session(s)
        checks[f"{s}_done"] = {
            "valid": got.state == "done",
            "detail": f"{got.state} {got.reason}".strip(),
        }
    sp = cluster.store.space(play.space)
    if sp.state != "ready":  # removed or lost as the last driver finished
        raise LateFault(f"the {play.kind} fault landed after the session had ended: {sp}")
    checks.update(_session_checks(cluster, sessions, play.space))
    checks.update(t.verdicts())
    if play.kind == "race":
        checks["race_second_waited"] = _second_waited(cluster)
    record.checks = checks
    record.faults = dict(sorted((k, v) for k, v in play.faults.items() if v))
    record.kills = play.kills
    kinds = Counter(str(e.detail.get("driver_kind")) for e in events if e.kind == "driver_recovery")
    record.recoveries = dict(sorted(kinds.items()))
    record.attempts = sum(1 for e in events if e.kind == "epoch_issued")
    record.resume_latencies_ms = [round(x, 1) for x in play.resumes]
    record.resume_backoffs_ms = play.backoffs
    record.extra.update(
        t.counters(),
        epochs={
            s: [e.detail["epoch"] for e in events if e.kind == "epoch_issued" and e.session == s]
            for s in sessions
        },
        exit_codes=[e.detail.get("code") for e in events if e.kind == "driver_exited"],
        generation=sp.generation,
        restored_from=sp.restored_from,
        anomalies=[*t.lease, *t.epoch],
        **play.notes,
    )


def _second_waited(cluster: Any) -> Verdict:
    """b was pending on a's lease and issued its first epoch only once a had ended."""
    a_end = cluster.events("session_finished", "a")
    b_first = cluster.events("epoch_issued", "b")[:1]
    pending = cluster.events("lease_pending", "b")
    if not pending:  # a ended before b asked: no race to judge
        return {"valid": True, "detail": "a finished before b was submitted"}
    ok = bool(a_end and b_first and b_first[0].id > a_end[0].id)
    gap = (b_first[0].at - a_end[0].at).total_seconds() * 1000 if ok else None
    detail = f"b started {gap:.0f} ms after a ended" if gap is not None else "b started early"
    return {"valid": ok, "detail": detail}


SCENARIO = Redrive()
