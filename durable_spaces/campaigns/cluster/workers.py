"""Campaign workers on many machines: ``durable-spaces worker --db URL --id ID``.

A worker pulls runs from the store's queue (``dequeue_run``, oldest first, one worker per
run), runs each with ``durable_spaces.campaigns.run.run_one`` in a process of its own
(``durable_spaces/campaigns/worker.py``: runs share nothing, a wedged run takes only
itself down) and stores the record (``finish_run``, exactly once). What it guarantees:

- While a run works, its claim is renewed every ``claim_ttl / 3``. A worker that dies
  stops renewing, and its run goes back to the queue when the claim lapses: the next
  ``dequeue_run`` anywhere takes it over (``attempts`` + 1) and runs it again from
  scratch (``run_one`` starts every run from nothing). The run's process dies with its
  worker (``PR_SET_PDEATHSIG``), so a killed worker leaves no run behind on its machine.
- A worker that finds its claim taken (``ClaimLostError``) kills the run and drops it:
  its record would be refused anyway.
- A run's state lives on the worker's machine (``<work_dir>/<run id>``); only its record
  goes to the store.

``enqueue_runs`` is how a campaign puts its runs on the queue.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from durable_spaces.campaigns.record import RUN_ID_RE, Check, RunRecord
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.campaigns.worker import error_record
from durable_spaces.cluster.records import Run, check_name
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import ClaimLostError, ClusterError, ConfigError

log = logging.getLogger(__name__)

RUN_ONE = "durable_spaces.campaigns.run:run_one"
_PR_SET_PDEATHSIG = 1


def enqueue_runs(store: ClusterStore, campaign: str, runs: Iterable[RunSpec]) -> list[Run]:
    """Queue ``runs`` for ``campaign`` (idempotent per run id)."""
    return [store.enqueue_run(r.run_id, campaign, r.to_json()) for r in runs]


def _die_with_parent() -> None:
    """In the run's child, before exec: SIGKILL when the worker dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ClusterWorker:
    """Pulls and runs campaign runs until ``stopping`` is set (module doc)."""

    def __init__(
        self,
        db_url: str,
        worker_id: str,
        work_dir: str | Path,
        *,
        campaign: str | None = None,
        claim_ttl: float = 30.0,
        poll_secs: float = 0.5,
        run_ref: str = RUN_ONE,
        until_empty: bool = False,
    ) -> None:
        self.id = check_name("worker", worker_id)
        self.store = ClusterStore(db_url)
        self.work_dir = Path(work_dir).absolute()
        self.campaign = campaign
        self.claim_ttl = claim_ttl
        self.poll_secs = poll_secs
        self.run_ref = run_ref
        self.until_empty = until_empty
        self.stopping = threading.Event()
        self.finished: list[str] = []

    def run(self) -> int:
        """Work until stopped (or, with ``until_empty``, until no run is open); the
        number of records this worker stored."""
        try:
            while not self.stopping.is_set():
                try:
                    got = self.store.dequeue_run(self.id, self.claim_ttl, self.campaign)
                except ClusterError as e:
                    log.warning("dequeue failed: %s", e)
                    got = None
                if got is not None:
                    self._work(got)
                    continue
                if self.until_empty and self._all_done():
                    break
                self.stopping.wait(self.poll_secs)
        finally:
            self.store.close()
        return len(self.finished)

    def _refuse(self, run: Run, why: str) -> None:
        """Finish ``run`` as a lab error saying ``why`` (its spec could not be read)."""
        log.warning("run %s refused: %s", run.id, why)
        rid = run.id if RUN_ID_RE.fullmatch(run.id) else "refused"
        check = Check(valid=None, detail=why)
        record = RunRecord(rid, "-", "-", "-", 0, outcome="lab_error", checks={"run": check})
        try:
            self.store.finish_run(run.id, self.id, record.to_json())
            self.finished.append(run.id)
        except ClaimLostError as e:
            log.warning("record of %s refused: %s", run.id, e)

    def _all_done(self) -> bool:
        with contextlib.suppress(ClusterError):
            return all(r.state == "done" for r in self.store.runs(self.campaign))
        return False

    def _work(self, run: Run) -> None:
        try:  # read back from the store: checked as a campaign's flags are (spec.check_run)
            spec = RunSpec.from_json(run.spec).with_(state_dir=str(self.work_dir / run.id))
        except (ConfigError, ValueError, TypeError, KeyError, AttributeError) as e:
            self._refuse(run, f"the queued run is not one this build runs: {e}")
            return
        home = self.work_dir / f".{run.id}.attempt{run.attempts}"
        home.mkdir(parents=True, exist_ok=True)
        spec_path, out_path = home / "spec.json", home / "record.json"
        spec_path.write_text(json.dumps(spec.to_json()))
        argv = [sys.executable, "-m", "durable_spaces.campaigns.worker", self.run_ref]
        log.info("run %s (attempt %d)", run.id, run.attempts)
        with open(home / "run.log", "ab") as out:
            proc = subprocess.Popen(
                [*argv, str(spec_path), str(out_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # prctl only: no lock is taken in the child
            )
        if not self._supervise(run, proc):
            return  # the claim went to another worker: nothing of ours may be stored
        try:
            record = RunRecord.load(out_path)
        except (OSError, ValueError, TypeError, KeyError) as e:
            record = error_record(spec, f"the run's process exited {proc.returncode}: {e}")
        try:
            self.store.finish_run(run.id, self.id, record.to_json())
            self.finished.append(run.id)
        except ClaimLostError as e:
            log.warning("record of %s refused: %s", run.id, e)

    def _supervise(self, run: Run, proc: subprocess.Popen[bytes]) -> bool:
        """Renew the claim until the run's process exits; False when the claim was lost
        (the process is killed then)."""
        every = self.claim_ttl / 3
        next_renew = time.monotonic() + every
        while proc.poll() is None:
            if self.stopping.is_set():
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, min(every, next_renew - time.monotonic())))
            if proc.poll() is None and time.monotonic() >= next_renew:
                next_renew = time.monotonic() + every
                try:
                    self.store.renew_run(run.id, self.id, self.claim_ttl)
                except ClaimLostError as e:
                    log.warning("run %s taken over: %s", run.id, e)
                    proc.kill()
                    proc.wait()
                    return False
                except ClusterError as e:  # away: a lapsed claim nobody took is still ours
                    log.warning("renewing %s failed: %s", run.id, e)
        return not self.stopping.is_set()
