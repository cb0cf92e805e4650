"""A one-machine cluster lab, for the tests and ``bench/cluster.py``: host agents in
network namespaces (real cua-spacesd on each host's own address, ``netns.py``),
coordinators and workers as processes in the root namespace, sessions submitted through
the store, and what a test reads back (events, drivers, logs, the workspace).

Everything it starts is a real ``durable-spaces host / coordinator`` process; ``close()``
ends them (and drivers whose coordinator was killed). The lab is the cluster's operator:
it makes the CA (``<root>/ca``) and enrols each host and coordinator it starts in one step
(``enrol.enrol_here``, ``<root>/tls/<id>``), and asks hosts as coordinator ``lab``. Needs
root, iproute2, PostgreSQL and the cua-spacesd binary (the tests skip, naming what is
missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import psutil

from durable_spaces.backends.docker import DockerBackend
from durable_spaces.backends.local import LocalBackend
from durable_spaces.backends.spacesd import SpacesdBackend
from durable_spaces.campaigns.agent import AgentConfigFile
from durable_spaces.campaigns.checker import (
    History,
    Inputs,
    LaunchRecord,
    Workload,
    collect,
    load_history,
)
from durable_spaces.campaigns.cluster.netns import NetnsHost, NetnsLab
from durable_spaces.campaigns.cluster.submit import agent_config, submit_session
from durable_spaces.cluster import enrol
from durable_spaces.cluster.drive import SharedDirectory
from durable_spaces.cluster.host import local_name
from durable_spaces.cluster.hostapi import HostClients
from durable_spaces.cluster.pki import Authority, identity
from durable_spaces.cluster.records import Event
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.cluster.tls import Trust
from durable_spaces.drive.entry import LOG_FILE
from durable_spaces.errors import ClusterError, HostApiError, SpaceGoneError, SpaceUnavailableError
from durable_spaces.host.ports import free_port
from durable_spaces.space import SpaceBackend

T = TypeVar("T")
CLI = (sys.executable, "-m", "durable_spaces.cli")
#: The lab coordinators' claim TTL (renewed every third of it). Hosts heartbeat every
#: 0.5 s and count as lost after 3 s: a loaded machine must not lose a healthy one.
CLAIM_TTL = 5.0


def wait_for(
    what: str, fn: Callable[[], T | None], timeout: float = 60.0, every: float = 0.05
) -> T:
    end = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


@dataclass
class LabHost:
    id: str
    ip: str
    address: str  # its API, ip:port
    state_dir: Path
    proc: subprocess.Popen[bytes]
    backend: str = "spacesd"
    ns: NetnsHost | None = None  # None: the root namespace (this machine itself)


async def _remove_all(backend: SpaceBackend) -> None:
    try:
        for name in await backend.names():
            with contextlib.suppress(Exception):
                await backend.delete(name)
    finally:
        await backend.close()


class Cluster:
    def __init__(self, url: str, root: Path, lab: NetnsLab) -> None:
        self.url = url
        self.root = root
        self.lab = lab
        self.store = ClusterStore(url)
        self.sessions = SharedDirectory(root / "sessions")
        self.hosts: dict[str, LabHost] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        enrol.init(self.store, root / "ca")
        self.ca: Authority = enrol.load_authority(root / "ca")
        self.trust = Trust(self.enrol("coordinator", "lab"))
        self.clients = HostClients(self.trust)

    def enrol(self, role: str, id_: str) -> Path:
        """A TLS directory holding a certificate of ``role`` ``id_`` (the lab's CA)."""
        d = self.root / "tls" / f"{role}-{id_}"
        enrol.enrol_here(self.store, self.ca, d, identity(role, id_))
        return d

    # -- processes -----------------------------------------------------------------------

    def _log(self, name: str) -> Any:
        return open(self.root / f"{name}.log", "ab")

    def host(self, host_id: str, backend: str = "spacesd", *, root_ns: bool = False) -> LabHost:
        """A host agent in a new namespace; ``root_ns``: on this machine itself, on the
        bridge's address (docker publishes Spaces on the root namespace's loopback, which
        a namespace cannot reach). Only a namespaced host can be lost."""
        ns = None if root_ns else self.lab.add_host()
        ip = self.lab.gateway if ns is None else ns.address
        address = f"{ip}:{free_port(ip) if ns is None else 7000}"
        state = self.root / "hosts" / host_id
        argv = [*CLI, "host", "--db", self.url, "--id", host_id, "--backend", backend]
        argv += ["--address", address, "--state-dir", str(state)]
        argv += ["--heartbeat-secs", "0.5", "--sweep-secs", "1"]
        argv += ["--tls-dir", str(self.enrol("host", host_id))]
        with self._log(host_id) as log:
            if ns is None:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            else:
                proc = ns.popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        h = LabHost(host_id, ip, address, state, proc, backend, ns)
        self.hosts[host_id] = h
        wait_for(f"host {host_id} up", lambda: self._host_up(host_id), 60)
        return h

    def _host_up(self, host_id: str) -> bool:
        if not any(h.id == host_id and h.state == "up" for h in self.store.hosts()):
            return False
        try:
            self.trust.refresh(self.store, every=1.0)
            self.clients.get(host_id, self.hosts[host_id].address).status("probe", 1)
        except HostApiError:
            return False
        return True

    def lose(self, host_id: str) -> None:
        h = self.hosts[host_id]
        if h.ns is None:
            raise ClusterError(f"host {host_id} is this machine: it cannot be lost")
        h.ns.lose()
        h.proc.wait(10)

    def coordinator(self, cid: str, *extra: str) -> subprocess.Popen[bytes]:
        argv = [*CLI, "coordinator", "--db", self.url, "--id", cid]
        argv += ["--tls-dir", str(self.enrol("coordinator", cid))]
        argv += ["--sessions-dir", str(self.sessions.root), "--claim-ttl", str(CLAIM_TTL)]
        argv += ["--backoff", "0.5,2,2", "--lost-host-secs", "3", "--stall-secs", "30", *extra]
        with self._log(cid) as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for h in self.hosts.values():  # containers outlive their agent: remove them
            if h.backend == "docker":
                asyncio.run(_remove_all(DockerBackend(h.state_dir / "spaces")))
        for pid in self.driver_pids():  # drivers of a coordinator a test killed
            with contextlib.suppress(psutil.Error):
                if "durable_spaces.campaigns.agent" in " ".join(psutil.Process(pid).cmdline()):
                    os.kill(pid, signal.SIGKILL)
        self.clients.close()
        self.store.close()

    # -- sessions ------------------------------------------------------------------------

    def submit(self, name: str, space: str | None, seed: str, calls: int = 6, **kw: Any) -> None:
        kw.setdefault("sleep", 0.3)
        submit_session(
            self.store, self.sessions, name, agent_config(seed, calls, **kw), space=space
        )

    def wait_session(self, name: str, timeout: float = 120.0) -> Any:
        return wait_for(
            f"session {name} to end",
            lambda: (s := self.store.session(name)).state in ("done", "failed") and s,
            timeout,
            0.1,
        )

    def events(self, kind: str | None = None, session: str | None = None) -> list[Event]:
        return self.store.events(kind, session=session)

    def drivers(self, session: str) -> list[tuple[int, int]]:
        """(epoch, pid) of every driver launched for ``session``, in order."""
        return [
            (int(e.detail["epoch"]), int(e.detail["pid"]))
            for e in self.events("driver_launched", session)
        ]

    def driver_pids(self) -> list[int]:
        return [int(e.detail["pid"]) for e in self.events("driver_launched")]

    def wait_first_step(self, session: str, epoch: int, timeout: float = 60.0) -> Event:
        def step() -> Event | None:
            got = [
                e
                for e in self.events("driver_first_step", session)
                if e.detail.get("epoch") == epoch
            ]
            return got[0] if got else None

        return wait_for(f"{session}'s first step at epoch {epoch}", step, timeout)

    def kill_driver(self, session: str, epoch: int) -> float:
        """SIGKILL the driver of that epoch; the time (unix ms) it was killed."""
        pid = dict(self.drivers(session))[epoch]
        if "durable_spaces.campaigns.agent" not in " ".join(psutil.Process(pid).cmdline()):
            raise ClusterError(f"pid {pid} is no longer the driver of epoch {epoch}")
        t = time.time() * 1000
        os.kill(pid, signal.SIGKILL)
        return t

    # -- checking ------------------------------------------------------------------------

    def history(self, session: str) -> History:
        return load_history(self.sessions.state_dir(session) / LOG_FILE)

    def launches(self, session: str) -> list[LaunchRecord]:
        """The session's drivers as the coordinators recorded them in the store."""
        rows: list[LaunchRecord] = []
        for e in self.events(session=session):
            epoch = int(e.detail.get("epoch", 0))
            if e.kind == "driver_launched":
                rows.append(LaunchRecord(epoch, e.detail.get("pid"), e.detail.get("unix_ms")))
                continue
            at = max((i for i, r in enumerate(rows) if r.epoch == epoch), default=None)
            if at is not None and e.kind == "driver_exited":
                rows[at] = replace(rows[at], exit_code=e.detail.get("code"))
            elif at is not None and e.kind == "driver_done":
                rows[at] = replace(rows[at], done_ms=e.detail.get("unix_ms"))
        return rows

    def inputs(self, session: str, space: str) -> Inputs:
        """Everything the campaign checker reads about one session: its log, its Space's
        workspace and processes (through the host's own backend: the test is an operator
        on the same machine, with the host's files), its workload and its launches."""
        sp = self.store.space(space)
        if sp.state != "ready" or sp.host_id is None:
            raise SpaceUnavailableError(f"space {space} is not placed: {sp}")
        host = self.hosts[sp.host_id]
        state_dir = self.sessions.state_dir(session)
        cfg = AgentConfigFile.load(state_dir)
        workload = Workload(seed=cfg.seed, calls=cfg.calls, sleep=cfg.sleep, server=cfg.server)

        async def read() -> Inputs:
            backend: SpaceBackend
            if host.backend == "local":
                backend = LocalBackend(host.state_dir / "spaces")
            elif host.backend == "docker":
                backend = DockerBackend(host.state_dir / "spaces")
            else:
                backend = SpacesdBackend(host.state_dir / "spaces", listen_host=host.ip)
            try:
                found = await backend.find(local_name(space, sp.generation))
                if found is None:
                    raise SpaceGoneError(f"{space} generation {sp.generation} not on {host.id}")
                return await collect(
                    found,
                    state_dir / LOG_FILE,
                    workload=workload,
                    launches=self.launches(session),
                    store=cfg.store_dir,
                )
            finally:
                await backend.close()

        return asyncio.run(read())
