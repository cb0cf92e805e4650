"""Test hosts as Linux network namespaces: machines of their own address that can be lost
for real, made and removed by the tests themselves.

A ``NetnsLab`` is a bridge in the root namespace with a /24 of 10.77.0.0/16 (the first
free one: concurrent labs take different ones) and address ``.1``; each ``NetnsHost`` is a
namespace with loopback up and a veth to the bridge carrying ``.2``, ``.3``, .... Nothing
else: no default route and no NAT, so hosts reach only each other and the root namespace
(where the tests, coordinators and drivers run). Where ``br_netfilter`` sends bridged
traffic through iptables, one FORWARD rule accepts this bridge's own traffic (removed with
the lab).

Losing a host (``NetnsHost.lose``) is a real event: every process in the namespace is
SIGKILLed (``ip netns pids``, which also sees processes in PID namespaces below it, like
the Spaces' daemons) and the namespace is deleted, its veth with it.

Teardown is complete: ``close()`` removes hosts, bridge and rule; a lab records itself
under ``RUN_DIR`` so ``sweep_stale()`` removes what a killed test process left behind.
Everything here runs ``ip`` (iproute2) and needs root; ``unavailable_reason()`` says why
not when it cannot.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from durable_spaces.errors import NetnsError
from durable_spaces.host.bounded import load_object
from durable_spaces.host.proc_start import started

RUN_DIR = Path("/tmp/ds-netns")
BASE = ipaddress.IPv4Network("10.77.0.0/16")
_probe: str | bool | None = False


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r


def unavailable_reason() -> str | None:
    """Why namespaces, veths and bridges cannot be made here (None when they can)."""
    global _probe
    if _probe is False:
        if shutil.which("ip") is None:
            _probe = "no ip binary (iproute2) on PATH"
        elif os.geteuid() != 0:
            _probe = "ip netns needs root"
        else:
            name = f"dsprobe{os.getpid() % 100000}"
            try:
                _ip("netns", "add", name)
                _ip("link", "add", f"{name}b", "type", "bridge")
                _probe = None
            except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
                _probe = f"ip netns / bridges are not permitted here: {e}"
            finally:
                _ip("link", "del", f"{name}b", check=False)
                _ip("netns", "del", name, check=False)
    return _probe if isinstance(_probe, str) else None


def _iptables_needed() -> bool:
    try:
        return Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text().strip() == "1"
    except OSError:
        return False


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    RUN_DIR.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(RUN_DIR / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _used_subnets() -> set[ipaddress.IPv4Network]:
    out = _ip("-4", "-o", "addr", "show").stdout
    used = set()
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            net = ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).network
            used.add(net)
    for f in RUN_DIR.glob("*.json"):  # labs being set up right now
        with contextlib.suppress(OSError, ValueError, KeyError):
            used.add(ipaddress.IPv4Network(load_object(f)["subnet"]))
    return used


class NetnsHost:
    """One namespace on the lab's bridge."""

    def __init__(self, lab: NetnsLab, index: int) -> None:
        self.lab = lab
        self.index = index
        self.name = f"ds{lab.tag}h{index}"
        self.veth = f"dsv{lab.tag}{index}"
        self.address = str(lab.subnet.network_address + 1 + index)
        self.lost = False

    def __repr__(self) -> str:
        return f"NetnsHost({self.name!r}, {self.address!r})"

    def _make(self) -> None:
        _ip("netns", "add", self.name)
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        _ip("link", "set", self.veth, "master", self.lab.bridge, "up")
        _ip("-n", self.name, "addr", "add", f"{self.address}/24", "dev", "eth0")
        _ip("-n", self.name, "link", "set", "eth0", "up")
        _ip("-n", self.name, "link", "set", "lo", "up")

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kw: Any
    ) -> subprocess.Popen[bytes]:
        if self.lost:
            raise NetnsError(f"host {self.name} was lost")
        return subprocess.Popen(self.argv(argv), env=dict(env) if env else None, **kw)

    def pids(self) -> list[int]:
        r = _ip("netns", "pids", self.name, check=False)
        return [int(x) for x in r.stdout.split() if x.isdigit()]

    def freeze(self) -> list[int]:
        """SIGSTOP every process of the namespace: a machine that hangs. Its sockets stay
        open and silent (no reset, no heartbeat); ``lose`` still ends it."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    def lose(self, timeout: float = 10.0) -> None:
        """SIGKILL every process of the namespace, then delete it (see the module doc)."""
        self.lost = True
        end = time.monotonic() + timeout
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > end:
                raise NetnsError(f"processes of {self.name} survived SIGKILL: {pids}")
            time.sleep(0.02)  # a zombie is no longer listed: its parent reaps it
        _ip("netns", "del", self.name, check=False)


class NetnsLab:
    """A bridge and its hosts (module doc). ``with NetnsLab() as lab: h = lab.add_host()``."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.bridge = f"dsbr{self.tag}"
        self.hosts: list[NetnsHost] = []
        self.subnet = BASE  # chosen in up()
        self._rule: list[str] | None = None
        self._record = RUN_DIR / f"{self.tag}.json"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge."""
        return str(self.subnet.network_address + 1)

    def up(self) -> NetnsLab:
        with _lock():
            used = _used_subnets()
            free = next((n for n in BASE.subnets(new_prefix=24) if n not in used), None)
            if free is None:
                raise NetnsError(f"no free /24 left in {BASE}")
            self.subnet = free
            self._write()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            if _iptables_needed() and shutil.which("iptables"):
                rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
                subprocess.run(["iptables", "-I", *rule], check=True, capture_output=True)
                self._rule = rule
                self._write()
        except BaseException:
            self.close()
            raise
        return self

    def _write(self) -> None:
        body = {
            "owner": os.getpid(),
            "owner_start": started(os.getpid()),
            "subnet": str(self.subnet),
            "bridge": self.bridge,
            "rule": self._rule,
            "hosts": [h.name for h in self.hosts],
        }
        self._record.write_text(json.dumps(body))

    def add_host(self) -> NetnsHost:
        host = NetnsHost(self, len(self.hosts) + 1)
        self.hosts.append(host)
        self._write()
        try:
            host._make()
        except BaseException:
            host.lose()
            raise
        return host

    def close(self) -> None:
        """Remove every host, the bridge and the rule; safe to call twice."""
        errors = []
        for h in self.hosts:
            try:
                h.lose()
            except NetnsError as e:
                errors.append(str(e))
        _teardown(self.bridge, self._rule, [])
        self._rule = None
        self._record.unlink(missing_ok=True)
        if errors:
            raise NetnsError("; ".join(errors))

    def __enter__(self) -> NetnsLab:
        return self.up()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _teardown(bridge: str, rule: list[str] | None, hosts: Sequence[str]) -> None:
    for name in hosts:
        r = _ip("netns", "pids", name, check=False)
        for pid in (int(x) for x in r.stdout.split() if x.isdigit()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _ip("netns", "del", name, check=False)
    _ip("link", "del", bridge, check=False)
    if rule is not None:
        subprocess.run(["iptables", "-D", *rule], capture_output=True, check=False)


def sweep_stale() -> list[str]:
    """Remove labs whose owning process is dead (a test run that was killed)."""
    removed: list[str] = []
    if not RUN_DIR.is_dir():
        return removed
    with _lock():
        for f in RUN_DIR.glob("*.json"):
            try:
                rec = load_object(f)
            except (OSError, ValueError):
                f.unlink(missing_ok=True)
                continue
            try:
                start = started(int(rec["owner"]))
                alive = abs(start - float(rec["owner_start"])) < 0.05
            except (psutil.Error, KeyError, ValueError, TypeError):
                alive = False
            if alive:
                continue
            _teardown(rec.get("bridge", ""), rec.get("rule"), rec.get("hosts", []))
            f.unlink(missing_ok=True)
            removed.append(f.stem)
    return removed
