"""The coordinator's ``place_space``: make sure a durable Space is up somewhere before a
drive, placing it again (generation + 1, from scratch) when it is not.

Before each drive (the reference's fix for drivers started on dead addresses), for a
Space the store says is ready, the Space's host is asked (``hostapi.py``). An answer is
taken only from that host: the client's TLS checks that the peer's certificate names the
host the store placed the Space on, so whatever else listens at its address (an impostor
on a restarting host's port, another host of the cluster) gets nothing and says nothing.
And no answer unplaces a Space by itself: only the store's own evidence does (the host's
report, ``space_lost``, or its heartbeat lapsing, ``mark_lost_hosts``).

- ``up``: drive it. ``down``: the host boots it in its sweep; try again after a backoff.
- ``gone``: the host has reported it to the store; placed again from what the store says.
- ``unknown``: the host does not provide that generation now; if the store still places it
  there, the host's sweep reports it (its own word, under its own lock: a placement in
  flight is not taken for a loss); until then the drive waits (``SpaceUnavailableError``).
- no answer, or an answer from a peer that is not the host: asked again until the host
  answers or has been silent in the store for ``lost_host_secs`` (then it is declared lost:
  ``ClusterStore.mark_lost_hosts``, which unplaces its Spaces). A host that keeps
  heartbeating without answering is only slow: after the bound the drive waits.

A Space waiting for placement goes to the up host with the fewest ready Spaces (among
``backends``, when given); a host that cannot take it is skipped, a placement another
coordinator won meanwhile is taken as is. Blocking: run it in a thread.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from durable_spaces.cluster.hostapi import HostClient, HostClients
from durable_spaces.cluster.records import SpaceRecord
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.cluster.tls import Trust
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
        trust: Trust,
        *,
        lost_host_secs: float = 5.0,
        backends: Sequence[str] = (),
        place_timeout: float = 120.0,
    ) -> None:
        self.store = store
        self.trust = trust
        self.clients = HostClients(trust)
        self.lost_host_secs = lost_host_secs
        self.backends = tuple(backends)
        self.place_timeout = place_timeout
        #: Placements this placer made (generation, host), for the lab's figures.
        self.placed: list[tuple[str, int, str]] = []

    def close(self) -> None:
        self.clients.close()

    def _client(self, host_id: str, address: str) -> HostClient:
        # The revocation list at most a second old: a revoked host is refused from then on.
        self.trust.refresh(self.store, every=1.0)
        return self.clients.get(host_id, address)

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
            self._client(host.id, host.address).rotate(sp.name, sp.generation, lease)
        except (ClusterConflictError, HostApiError, UnknownRecordError) as e:
            raise SpaceUnavailableError(f"space {sp.name}: rotating its token: {e}") from e

    def _still_there(self, sp: SpaceRecord) -> bool:
        """True when its host says it is up; False when it was moved to placement."""
        hosts = {h.id: h for h in self.store.hosts()}
        host = hosts.get(sp.host_id or "")
        if host is None or host.state != "up":
            raise SpaceUnavailableError(f"space {sp.name}: its host {sp.host_id} is lost")
        client = self._client(host.id, host.address)
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
            raise SpaceUnavailableError(
                f"space {sp.name}: host {host.id} does not provide generation"
                f" {sp.generation} now (its own sweep reports it if it lost it)"
            )
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
        for h in hosts:
            try:
                self._client(h.id, h.address).place(
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
