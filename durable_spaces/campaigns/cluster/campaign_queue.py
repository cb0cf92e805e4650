"""``durable-spaces campaign --db URL``: a campaign's runs on the cluster's queue.

The campaign enqueues every run at once (``enqueue_runs``; a run's queue id is
``<campaign>.<run id>`` because the queue is shared by all campaigns) and waits for the
records that workers anywhere (``durable-spaces worker --db URL``, ``workers.py``) store,
then reports as a local campaign does: the same ``runs/`` records, SUMMARY line and
report. What it keeps from the queue's guarantees: a worker killed mid-run gives its run
back when its claim lapses and another worker runs it again from scratch; each record is
stored exactly once, so the campaign counts each run once.

What stays on this machine: replaying a failed run exactly (``--retries``) and
shrinking, which need the run's schedule and a driver at hand, not the queue.
"""

from __future__ import annotations

import asyncio
import threading
import time

from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.spec import RunSpec
from durable_spaces.campaigns.worker import error_record
from durable_spaces.cluster.records import check_name
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import ClusterError, ConfigError, RecordError


class QueuedRuns:
    """A ``RunExecutor`` (``durable_spaces/campaigns/runner.py``) over the store's queue."""

    def __init__(
        self,
        db_url: str,
        campaign: str,
        *,
        poll_secs: float = 0.5,
        run_timeout_s: float | None = None,
    ) -> None:
        self.campaign = check_name("campaign", campaign)
        self.store = ClusterStore(db_url)
        self.poll_secs = poll_secs
        self.timeout = run_timeout_s
        # One connection, used by one thread at a time (runs wait concurrently).
        self._lock = threading.Lock()

    def queue_id(self, spec: RunSpec) -> str:
        return check_name("run id", f"{self.campaign}.{spec.run_id}")

    def _enqueue(self, spec: RunSpec) -> None:
        with self._lock:
            self.store.enqueue_run(self.queue_id(spec), self.campaign, spec.to_json())

    def _record(self, spec: RunSpec) -> RunRecord | None:
        with self._lock:
            run = self.store.run(self.queue_id(spec))
        if run.state != "done" or run.record is None:
            return None
        try:
            return RunRecord.from_json(run.record)
        except (RecordError, ValueError, TypeError, KeyError) as e:
            return error_record(spec, f"the stored record of {run.id} cannot be read: {e}")

    async def run(self, spec: RunSpec) -> RunRecord:
        """Queue ``spec`` and wait for the record a worker stores (or the run timeout:
        the worker's claim is the run's own timeout there, this one only the wait's)."""
        t0 = time.monotonic()
        await asyncio.to_thread(self._enqueue, spec)
        while True:
            try:
                rec = await asyncio.to_thread(self._record, spec)
            except ClusterError:
                rec = None  # the database restarting: the store reconnects; wait on
            if rec is not None:
                return rec
            waited = time.monotonic() - t0
            if self.timeout is not None and waited > self.timeout:
                return error_record(
                    spec, f"no worker stored a record within {self.timeout:g}s", waited
                )
            await asyncio.sleep(self.poll_secs)

    def close(self) -> None:
        self.store.close()


def campaign_name(out_dir_name: str, started_unix: float) -> str:
    """The queue's name for a campaign: its directory's name and its start second (a
    directory reused with ``--force`` is a new campaign, never the old one's records)."""
    try:
        return check_name("campaign", f"{out_dir_name}-{int(started_unix)}")
    except ConfigError as e:
        raise ConfigError(f"--out's directory name names the campaign on the queue: {e}") from None
