"""``no_leftover_processes``: nothing the workload did not leave runs in the Space.

The scripted workload's commands all finish, so after a run a Space runs only its own
machinery (the daemon and what it descends from, kernel threads of a microVM) and, in
the ``server`` mode, the heartbeat loop whose pid is in ``/tmp/ds-server.pid`` (with its
children). Any other process is a ``resurrected_process``: a command a recovery should
have killed, or one a restore brought back that the log does not explain.

How the processes are listed, per backend:

- ``local`` has no machine of its own: its commands are host processes carrying the
  Space's instance mark (``DS_SPACE`` in their environment, see
  ``durable_spaces/backends/local/procs.py``). Every such process, for any instance the log
  recorded, is a leftover.
- elsewhere a ledger-less command in the Space lists ``/proc`` there (spacesd runs in
  its own PID namespace, docker and microvm are machines of their own). The listing's
  own process, its descendants, its ancestors (the daemon, pid 1) and the daemon's
  helpers (processes of the daemon's own binary) are not counted. A
  spacesd without a PID namespace (the process-group fallback) sees the whole host:
  the check is then unknown.

A process seen once may be on its way out; leftovers are listed again a few times and
only those that stay are reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import psutil

from durable_spaces.campaigns.checks.inputs import Proc, ProcessListing
from durable_spaces.campaigns.checks.verdict import Verdict, anomaly, judge, unknown
from durable_spaces.space import Space

if TYPE_CHECKING:
    from durable_spaces.campaigns.checks.inputs import Inputs

#: Lists /proc from inside the Space: "SELF <pid>", "SERVER <pid>", "PROC <stat>\t<cmd>".
PROBE = r"""echo "SELF $$"
s=$(cat /tmp/ds-server.pid 2>/dev/null) && echo "SERVER $s"
for d in /proc/[0-9]*; do
  s=$(cat "$d/stat" 2>/dev/null) || continue
  c=$(tr '\000\n\t' '   ' < "$d/cmdline" 2>/dev/null)
  printf 'PROC %s\t%s\n' "$s" "$c"
done
true
"""
RECHECKS = 3
RECHECK_DELAY_S = 0.4


def parse_probe(output: bytes) -> ProcessListing:
    """The probe's output as a listing (kernel threads and zombies left out)."""
    probe = server = None
    rows: list[tuple[int, int, str, str, str]] = []  # pid, ppid, state, comm, cmdline
    for line in output.decode(errors="replace").splitlines():
        word, _, rest = line.partition(" ")
        if word == "SELF" and rest.strip().isdigit():
            probe = int(rest)
        elif word == "SERVER" and rest.strip().isdigit():
            server = int(rest)
        elif word == "PROC" and " (" in rest and ")" in rest:
            stat, _, cmd = rest.partition("\t")
            head, _, tail = stat.rpartition(")")
            pid_text, _, comm = head.partition(" (")
            fields = tail.split()
            if not pid_text.strip().isdigit() or len(fields) < 2 or not fields[1].isdigit():
                continue
            rows.append((int(pid_text), int(fields[1]), fields[0], comm, cmd.strip()))
    kthreadd = {pid for pid, ppid, _, comm, cmd in rows if ppid == 0 and not cmd and comm}
    procs = tuple(
        Proc(pid, ppid, cmd or f"[{comm}]")
        for pid, ppid, state, comm, cmd in rows
        if state != "Z" and not (not cmd and (ppid in kthreadd or pid in kthreadd))
    )
    return ProcessListing("namespace", procs, probe=probe, server_pid=server)


def _descendants(procs: Iterable[Proc], roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, []))
    return out


def leftovers(listing: ProcessListing, server: bool) -> list[Proc]:
    """The processes of ``listing`` that are neither the Space's machinery nor (server
    mode) the workload's server."""
    if listing.method == "mark":
        return list(listing.procs)
    by_pid = {p.pid: p for p in listing.procs}
    machinery: set[int] = set()
    q = listing.probe
    while q is not None and q in by_pid and q not in machinery:
        machinery.add(q)
        q = by_pid[q].ppid
    # The daemon's own helpers (e.g. cua-spacesd's ``fs-as`` for file operations) run
    # its binary; the workload's commands never do.
    parent = by_pid.get(by_pid[listing.probe].ppid) if listing.probe in by_pid else None
    daemon = parent.cmd.split(" ", 1)[0] if parent is not None else None
    helpers = {p.pid for p in listing.procs if daemon and p.cmd.split(" ", 1)[0] == daemon}
    roots = {listing.probe} if listing.probe is not None else set()
    if server and listing.server_pid is not None:
        roots.add(listing.server_pid)
    skip = machinery | helpers | _descendants(listing.procs, roots) | {1}
    return [p for p in listing.procs if p.pid not in skip]


def _marked(instances: set[str]) -> ProcessListing:
    me = os.getpid()
    procs = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (
                p.pid != me
                and p.status() != psutil.STATUS_ZOMBIE
                and p.environ().get("DS_SPACE") in instances
            ):
                procs.append(Proc(p.pid, p.ppid(), " ".join(p.cmdline())))
    return ProcessListing("mark", tuple(procs))


async def _probe(space: Space, kind: str) -> ProcessListing:
    res = await space.exec(["sh", "-c", PROBE], key=None, epoch=await space.current_epoch())
    if res.exit_code != 0:
        return ProcessListing("namespace", unknown=f"the /proc probe exited {res.exit_code}")
    listing = parse_probe(res.output)
    if listing.probe is None:
        return ProcessListing("namespace", unknown="the /proc probe printed no pid")
    me = next((p for p in listing.procs if p.pid == listing.probe), None)
    if kind == "process" and (me is None or me.ppid != 1):
        why = "the Space has no PID namespace: its processes cannot be told from the host's"
        return ProcessListing("namespace", unknown=why)
    return listing


async def list_processes(space: Space, instances: set[str], server: bool) -> ProcessListing:
    """What runs in ``space`` now, listed again while leftovers are seen (they may be on
    their way out)."""
    kind = (await space.capabilities()).kind
    marks = instances | {space.instance_id}
    listing = ProcessListing("namespace")
    for attempt in range(RECHECKS + 1):
        if attempt:
            await asyncio.sleep(RECHECK_DELAY_S)
        if kind == "local":
            listing = await asyncio.to_thread(_marked, marks)
        else:
            listing = await _probe(space, kind)
        if listing.unknown is not None or not leftovers(listing, server):
            break
    return listing


def no_leftover_processes(inputs: Inputs) -> Verdict:
    listing = inputs.processes
    if listing is None:
        return unknown("the Space's processes were not listed")
    if listing.unknown is not None:
        return unknown(listing.unknown)
    server = inputs.workload is not None and inputs.workload.server
    commands = {
        str(tc["args"]["command"]): cid
        for cid, tc in inputs.history.calls.items()
        if tc.get("name") == "bash" and isinstance((tc.get("args") or {}).get("command"), str)
    }
    found = []
    for p in leftovers(listing, server):
        calls = [cid for command, cid in commands.items() if command and command in p.cmd]
        detail = f"pid {p.pid} (parent {p.ppid}) still runs: {p.cmd[:160]!r}"
        found.append(anomaly("resurrected_process", detail, witness=[*calls, p.pid]))
    return judge(found, f"nothing left running ({len(listing.procs)} processes listed)")
