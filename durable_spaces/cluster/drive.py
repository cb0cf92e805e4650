"""Cluster coordinators: processes that claim durable sessions from the store and drive
them, any of which may die.

``durable-spaces coordinator --db URL --id ID --sessions-dir DIR`` runs one
(``ClusterCoordinator``). What it guarantees, on top of the single-host ``Coordinator``
(``durable_spaces/drive/coordinator.py``) that drives each session:

- A session is driven by the coordinator holding its claim (``claim_session``, SKIP
  LOCKED), renewed every ``claim_ttl / 3``. A coordinator that dies stops renewing; once
  the claim lapsed another one claims the session and drives it on. One that finds its
  claim taken (``ClaimLostError``) kills its driver and lets the session go.
- Epochs come from the store (``begin_drive``: ``max(previous + 1, lease token)``, durable
  before the driver starts), so exactly one driver runs per epoch whichever coordinator
  launched it, and epochs strictly increase across coordinators. A driver fenced with a
  floor raises the store's floor (``raise_epoch_floor``) before the next epoch.
- A session whose Space another session holds stays pending (``held by session:<first>``,
  one ``lease_pending`` event per spell, not per poll): the lease is read every
  ``pending_poll`` seconds and taken as soon as it is free, with the next lease token.
- Before each drive the Space is made ready (``placer.py``) and its host gives its daemon
  a token of this drive's lease (``Placer.rotate``: every older driver's is refused); the
  driver gets
  ``CUA_SESSION_SPACE``, the store's URL and its lease token (``remote.py``), and keeps
  the driver contract of ``durable_spaces/drive/entry.py`` (exit codes, heartbeats).
- The session ends in the store as the coordinator's run ended: ``done``, or ``failed``
  with the reason (a driver's permanent failure names what it printed).
- Every coordinator sweeps for lost hosts every ``lost_sweep_secs`` (hosts silent for
  ``lost_host_secs``), also while all its sessions run: a driver stuck on a lost host's
  Space learns it from the store and halts.
- Drivers of a coordinator that died are not killed by its successor (they may run on
  another machine): the epoch fence stops them (exit 75) as soon as the new driver starts.

Where a session's log lives is ``SessionFiles``: for this round a directory every
coordinator reaches (``SharedDirectory``; an NFS mount across machines).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from durable_spaces.cluster.leases import LEASE_SECS
from durable_spaces.cluster.placer import Placer
from durable_spaces.cluster.records import SessionRecord, check_name
from durable_spaces.cluster.remote import DB_ENV, connection_env
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.drive import protocol
from durable_spaces.drive.coordinator import Coordinator, CoordinatorResult
from durable_spaces.errors import ClaimLostError, ClusterError
from durable_spaces.host.bounded import read_text

#: How much of a driver's log is read for its last word (its tail is what counts).
MAX_DRIVER_LOG_BYTES = 64 << 20

log = logging.getLogger(__name__)

AGENT_ARGV = (sys.executable, "-m", "durable_spaces.campaigns.agent")
#: Coordinator events kept in the store (driver events: first_step, recovery too).
_EVENTS = {
    "launch": "driver_launched",
    "exit": "driver_exited",
    "kill": "driver_killed",
    "place_failed": "drive_place_failed",
    "stall": "drive_stall",
    "backoff": "drive_backoff",
}
#: How long a pending session only reads the lease before asking for it again.
PENDING_RECHECK_SECS = 5.0
_DRIVER_EVENTS = ("first_step", "recovery", "done")
_RESERVED = frozenset({"kind", "session", "space", "host", "coordinator"})


class SessionFiles(Protocol):
    """Where a session's state (its fenced log, the driver's configuration) lives."""

    def state_dir(self, session: str) -> Path: ...


class SharedDirectory:
    """Each session's state in ``<root>/<session>``, a directory every coordinator (and
    so every driver) reaches: on one machine any directory, across machines a shared
    mount. The SQLite fence needs working ``fcntl`` locks there."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).absolute()

    def state_dir(self, session: str) -> Path:
        return self.root / check_name("session", session)  # NAME has no '/' nor leading '.'


@dataclass
class DriveSettings:
    argv: Sequence[str] = AGENT_ARGV
    stall_secs: float = 60.0
    heartbeat_secs: float = 2.0
    backoff: tuple[float, float, float] = (2.0, 60.0, 2.0)
    max_attempts: int = 20
    claim_ttl: float = 10.0
    lease_ttl: float = LEASE_SECS
    lost_host_secs: float = 5.0
    lost_sweep_secs: float = 1.0
    poll_secs: float = 0.5
    pending_poll: float = 0.02
    max_sessions: int = 4
    backends: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)


def _permanent_reason(result: CoordinatorResult, state_dir: Path) -> str:
    """The reason a session failed, with what its last driver said about it."""
    if not result.epochs:
        return result.reason
    path = state_dir / "drivers" / f"epoch-{result.epochs[-1]}.log"
    try:
        lines = read_text(path, max_bytes=MAX_DRIVER_LOG_BYTES, errors="replace").splitlines()
    except (OSError, ValueError):  # a FIFO, a device, a log grown huge: no more to say
        return result.reason
    said = [x for x in lines if x.startswith("durable-spaces driver:")]
    return f"{result.reason}: {said[-1]}" if said else result.reason


class ClusterCoordinator:
    """Claims and drives sessions until ``stopping`` is set (module doc)."""

    def __init__(
        self,
        db_url: str,
        coordinator_id: str,
        files: SessionFiles,
        settings: DriveSettings | None = None,
    ) -> None:
        self.db_url = db_url
        self.id = check_name("coordinator", coordinator_id)
        self.files = files
        self.settings = settings or DriveSettings()
        self.store = ClusterStore(db_url)
        self.stopping = asyncio.Event()
        self.active: dict[str, asyncio.Task[str]] = {}
        self.results: dict[str, str] = {}

    async def run(self) -> None:
        s = self.settings
        swept = 0.0
        try:
            while not self.stopping.is_set():
                if time.monotonic() - swept >= s.lost_sweep_secs:
                    swept = time.monotonic()
                    await self._sweep_lost_hosts()
                claimed = None
                if len(self.active) < s.max_sessions:
                    try:
                        claimed = await asyncio.to_thread(
                            self.store.claim_session, self.id, s.claim_ttl
                        )
                    except ClusterError as e:
                        log.warning("claiming failed: %s", e)
                if claimed is not None and claimed.name not in self.active:
                    task = asyncio.create_task(self.drive(claimed))
                    self.active[claimed.name] = task
                    task.add_done_callback(self._forget(claimed.name))
                    continue  # there may be more to claim
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), s.poll_secs)
        finally:
            for task in list(self.active.values()):
                task.cancel()
            for task in list(self.active.values()):
                with contextlib.suppress(BaseException):
                    await task
            self.store.close()

    async def _sweep_lost_hosts(self) -> None:
        """Declare lost the hosts silent for ``lost_host_secs``: their Spaces wait for
        placement again, and drivers bound to them halt (``remote.py``)."""
        try:
            lost = await asyncio.to_thread(self.store.mark_lost_hosts, self.settings.lost_host_secs)
        except ClusterError as e:
            log.warning("lost-host sweep failed: %s", e)
            return
        for host in lost:
            log.warning("host %s declared lost", host)

    def _forget(self, name: str) -> Callable[[asyncio.Task[str]], None]:
        def done(task: asyncio.Task[str]) -> None:
            self.active.pop(name, None)

        return done

    async def drive(self, session: SessionRecord) -> str:
        """Drive one claimed session to its end (or until its claim is lost)."""
        name, s = session.name, self.settings
        store = ClusterStore(self.db_url)
        state_dir = self.files.state_dir(name)
        placer = Placer(store, lost_host_secs=s.lost_host_secs, backends=s.backends)
        events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        env = {**s.env, DB_ENV: self.db_url}
        lease: list[int | None] = [None]  # the lease token of the drive being launched
        if session.space is not None:
            env[protocol.SPACE] = session.space
            # The store's lease says who drives a Space: a session holding it takes the
            # Space as it is, another session's work included (adapter/space_owner.py);
            # the lease never lets two drive it at once.
            env["DS_SPACE_ADOPT"] = "as-is"

        async def epoch_source(floor: int) -> int:
            if floor:
                await asyncio.to_thread(store.raise_epoch_floor, name, self.id, floor)
            d = await asyncio.to_thread(store.begin_drive, name, self.id, s.lease_ttl)
            if d.pending:
                events.put_nowait(("drive_pending", {"reason": d.reason}))
            while d.pending:
                await self._await_lease(store, name, session.space)
                d = await asyncio.to_thread(store.begin_drive, name, self.id, s.lease_ttl)
            assert d.epoch is not None
            lease[0] = d.lease_token
            if d.lease_token is not None:
                coordinator.extra_env.update(connection_env(self.db_url, d.lease_token))
            return d.epoch

        async def place_space() -> None:
            if session.space is not None:
                sp = await asyncio.to_thread(placer.ensure, session.space)
                if lease[0] is not None:  # this drive's own daemon token (placer.rotate)
                    await asyncio.to_thread(placer.rotate, sp, lease[0])

        def on_event(ev: dict[str, Any]) -> None:
            kind = _EVENTS.get(ev["event"])
            data = ev.get("data") or {}
            if ev["event"] == "driver_event" and data.get("event") in _DRIVER_EVENTS:
                kind = f"driver_{data['event']}"
                ev = {**ev, **{k: v for k, v in data.items() if k != "event"}}
            if kind is not None:
                # record_event's own parameters cannot be detail keys
                detail = {
                    (f"driver_{k}" if k in _RESERVED else k): v
                    for k, v in ev.items()
                    if k not in ("event", "data")
                }
                events.put_nowait((kind, detail))

        coordinator = Coordinator(
            s.argv,
            state_dir,
            name,
            stall_secs=s.stall_secs,
            heartbeat_secs=s.heartbeat_secs,
            backoff=s.backoff,
            max_attempts=s.max_attempts,
            place_space=place_space if session.space is not None else None,
            on_event=on_event,
            env=env,
            epoch_source=epoch_source,
        )
        writer = asyncio.create_task(self._write_events(store, name, events))
        renewer = asyncio.create_task(self._renew(name))
        runner = asyncio.create_task(coordinator.run())
        try:
            await asyncio.wait({runner, renewer}, return_when=asyncio.FIRST_COMPLETED)
            if not runner.done():  # the claim was lost: stop our driver, let it go
                runner.cancel()
                with contextlib.suppress(BaseException):
                    await runner
                return self._ended(name, "claim_lost")
            try:
                result = runner.result()
            except ClaimLostError:
                return self._ended(name, "claim_lost")
            except Exception as e:  # e.g. the store stayed away: the claim lapses, and the
                log.exception("driving %s failed", name)  # session is claimed again
                return self._ended(name, f"error: {type(e).__name__}: {e}")
            state, reason = "done", ""
            if result.status != "done":
                state, reason = "failed", _permanent_reason(result, state_dir)
            try:
                await asyncio.to_thread(store.finish_session, name, self.id, state, reason)
            except ClaimLostError:
                return self._ended(name, "claim_lost")
            return self._ended(name, state)
        finally:
            renewer.cancel()
            with contextlib.suppress(BaseException):
                await renewer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(events.join(), 10)
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer
            store.close()

    async def _await_lease(self, store: ClusterStore, name: str, space: str | None) -> None:
        """Until ``space``'s lease looks free (or ``PENDING_RECHECK_SECS`` passed: a lease
        that expired still names its holder), reading it without taking it: each
        ``begin_drive`` that finds it held appends a ``lease_pending`` event."""
        assert space is not None
        end = time.monotonic() + PENDING_RECHECK_SECS
        while time.monotonic() < end:
            lease = await asyncio.to_thread(store.lease, space)
            if lease.holder in (None, name):
                return
            await asyncio.sleep(self.settings.pending_poll)

    def _ended(self, name: str, how: str) -> str:
        self.results[name] = how
        log.info("session %s: %s", name, how)
        return how

    async def _renew(self, name: str) -> None:
        """Returns when the claim is lost; renews it until then."""
        every = self.settings.claim_ttl / 3
        while True:
            await asyncio.sleep(every)
            try:
                await asyncio.to_thread(
                    self.store.renew_session_claim, name, self.id, self.settings.claim_ttl
                )
            except ClaimLostError:
                return
            except ClusterError as e:  # the database is away; a lapsed claim nobody
                log.warning("renewing %s failed: %s", name, e)  # took is still ours

    async def _write_events(
        self, store: ClusterStore, name: str, events: asyncio.Queue[tuple[str, dict[str, Any]]]
    ) -> None:
        while True:
            kind, detail = await events.get()
            try:
                await asyncio.to_thread(
                    store.record_event, kind, session=name, coordinator=self.id, **detail
                )
            except ClusterError as e:
                log.warning("could not record %s of %s: %s", kind, name, e)
            finally:
                events.task_done()
