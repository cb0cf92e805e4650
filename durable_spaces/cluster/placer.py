"""The coordinator's ``place_space``: make sure a durable Space is up somewhere before a
drive, placing it again (generation + 1, from scratch) when it is not.

Before each drive (the reference's fix for drivers started on dead addresses), for a
Space the store says is ready, the Space's host is asked (``hostapi.py``):

- ``up``: drive it. ``down``: the host boots it in its sweep; try again after a backoff.
- ``gone`` (the host reported it to the store) or ``unknown`` (the host does not provide
  that generation any more, e.g. it was declared lost and dropped it): placed again.
- no answer: asked again until the host answers or has been silent for
  ``lost_host_secs`` (then it is declared lost: ``ClusterStore.mark_lost_hosts``, which
  unplaces its Spaces). A host that keeps heartbeating without answering is only slow:
  after the bound the drive waits (``SpaceUnavailableError``: the coordinator backs off
  and asks again).

A Space waiting for placement goes to the up host with the fewest ready Spaces (among
``backends``, when given); a host that cannot take it is skipped, a placement another
coordinator won meanwhile is taken as is. Blocking: run it in a thread.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from durable_spaces.cluster.hostapi import HostClient
from durable_spaces.cluster.records import SpaceRecord
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.errors import (
    ClusterConflictError,
    ConfigError,
    HostApiError,
    HostLostError,
    SpaceUnavailableError,
    UnknownRecordError,
)


class Placer:
    def __init__(
        self,
        store: ClusterStore,
        *,
        lost_host_secs: float = 5.0,
        backends: Sequence[str] = (),
        place_timeout: float = 120.0,
    ) -> None:
        self.store = store
        self.lost_host_secs = lost_host_secs
        self.backends = tuple(backends)
        self.place_timeout = place_timeout
        #: Placements this placer made (generation, host), for the lab's figures.
        self.placed: list[tuple[str, int, str]] = []

    def ensure(self, name: str) -> SpaceRecord:
        """The Space, ready on a host that answered ``up`` (see the module doc)."""
        for _ in range(4):
            sp = self.store.space(name)
            if sp.state == "ready":
                if self._still_there(sp):
                    return sp
            else:
                placed = self._place(sp)
                if placed is not None:
                    return placed
        raise SpaceUnavailableError(f"space {name} could not be made ready")

    def rotate(self, sp: SpaceRecord, lease: int) -> None:
        """Have ``sp``'s host give its daemon a token of lease ``lease`` (the drive's, the
        current one): the previous holders' token is refused from then on, and
        ``ClusterStore.connect`` hands the new one to this lease's driver only."""
        host = next((h for h in self.store.hosts() if h.id == sp.host_id), None)
        if host is None:
            raise SpaceUnavailableError(f"space {sp.name}: its host {sp.host_id} is unknown")
        try:
            HostClient(host.address, self.store.host_secrets()[0]).rotate(
                sp.name, sp.generation, lease
            )
        except (ClusterConflictError, HostApiError, UnknownRecordError) as e:
            raise SpaceUnavailableError(f"space {sp.name}: rotating its token: {e}") from e

    def _still_there(self, sp: SpaceRecord) -> bool:
        """True when its host says it is up; False when it was moved to placement."""
        hosts = {h.id: h for h in self.store.hosts()}
        host = hosts.get(sp.host_id or "")
        if host is None or host.state != "up":
            raise SpaceUnavailableError(f"space {sp.name}: its host {sp.host_id} is lost")
        client = HostClient(host.address, self.store.host_secrets()[0])
        # A host that does not answer is waited for until it answers or its heartbeat is
        # older than the bound (then it is lost, its Spaces wait for placement): sooner
        # than a backoff and another drive would learn it.
        deadline = time.monotonic() + self.lost_host_secs + 1.0
        while True:
            try:
                st = client.status(sp.name, sp.generation)
                break
            except HostApiError as e:
                if host.id in self.store.mark_lost_hosts(self.lost_host_secs):
                    return False
                if self.store.space(sp.name) != sp:
                    return False  # moved meanwhile (someone else declared it lost)
                if time.monotonic() > deadline:
                    raise SpaceUnavailableError(f"space {sp.name}: {e}") from e
                time.sleep(0.2)
        if st["state"] == "up":
            return True
        if st["state"] == "down":
            raise SpaceUnavailableError(f"space {sp.name}: its daemon on {host.id} is down")
        if st["state"] == "unknown":
            why = f"host {host.id} does not provide generation {sp.generation}"
            self.store.space_lost(sp.name, sp.generation, why)
        return False  # gone: the host reported it, it waits for placement

    def _place(self, sp: SpaceRecord) -> SpaceRecord | None:
        self.store.mark_lost_hosts(self.lost_host_secs)
        ready = Counter(s.host_id for s in self.store.spaces("ready"))
        hosts = [
            h
            for h in self.store.hosts()
            if h.state == "up" and (not self.backends or h.backend in self.backends)
        ]
        hosts.sort(key=lambda h: (ready[h.id], h.id))
        tried = []
        secret = self.store.host_secrets()[0]
        for h in hosts:
            try:
                HostClient(h.address, secret).place(
                    sp.name, sp.generation, timeout=self.place_timeout
                )
            except ClusterConflictError:
                return None  # placed meanwhile (by another coordinator): read it again
            except (HostApiError, HostLostError, ConfigError, UnknownRecordError) as e:
                tried.append(f"{h.id}: {e}")
                continue
            self.placed.append((sp.name, sp.generation, h.id))
            return None  # read back as the store has it
        raise SpaceUnavailableError(
            f"space {sp.name} generation {sp.generation}: no host could place it"
            + (f" ({'; '.join(tried)})" if tried else " (no host is up)")
        )
