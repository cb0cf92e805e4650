"""What a local Space's epoch cgroups add (``python -m bench.local_cgroups``).

The parts ``durable_spaces/backends/local/cgroups.py`` adds to a spawn and an advance,
each timed alone on a ``sleep`` child: making an epoch's cgroup, moving the first
supervisor of an epoch into it and the next ones (the kernel's first move after a quiet
spell waits for an RCU grace period: ``cgroup_threadgroup_rwsem``), and an advance's
kill of a cgroup holding one process (``cgroup.kill``, wait for ``populated 0``,
``rmdir``) against a plain ``SIGKILL`` and wait of the same process. Then the fence that
keeps a command in its cgroup (``backends/local/confine.py``): building it (once per fork
server, once per directly started supervisor), and a child that applies it and exits
against one that only exits: its Landlock half alone (a fork server's child: the seccomp
half is the server's own, inherited) and both halves (a directly started supervisor).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from durable_spaces.backends.local import confine
from durable_spaces.backends.local.cgroups import SpaceCgroups, parent_for

ROUNDS = 40


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:8.3f} ms"


def main(rounds: int) -> None:
    parent, why = parent_for(Path(tempfile.mkdtemp(prefix="bench-cgroups-")))
    if parent is None:
        print(f"skipped: no cgroups here: {why}")
        return
    cgs = SpaceCgroups(parent, None, f"bench{os.getpid()}")
    make: list[float] = []
    first: list[float] = []
    later: list[float] = []
    kill: list[float] = []
    plain: list[float] = []
    try:
        for i in range(rounds):
            procs = [subprocess.Popen(["sleep", "100"]) for _ in range(3)]
            time.sleep(0.05)  # a quiet spell, as between a driver's advance and its spawn
            t0 = time.perf_counter()
            cgs.prepare(i)
            make.append(time.perf_counter() - t0)
            for j, p in enumerate(procs):
                t0 = time.perf_counter()
                cgs.enter(i, p.pid)
                (first if j == 0 else later).append(time.perf_counter() - t0)
            time.sleep(0.05)
            t0 = time.perf_counter()
            cgs.kill_below(i + 1)
            kill.append(time.perf_counter() - t0)
            for p in procs:
                p.wait()
            q = subprocess.Popen(["sleep", "100"])
            time.sleep(0.05)
            t0 = time.perf_counter()
            q.kill()
            os.waitid(os.P_PID, q.pid, os.WEXITED | os.WNOWAIT)
            plain.append(time.perf_counter() - t0)
            q.wait()
    finally:
        cgs.remove()
    print(f"make an epoch's cgroup           {_ms(make)}")
    print(f"move the first supervisor in     {_ms(first)}")
    print(f"move a later one in              {_ms(later)}")
    print(f"kill+wait+remove (3 processes)   {_ms(kill)}")
    print(f"plain SIGKILL+wait (1 process)   {_ms(plain)}")
    _fence(rounds)


#: Timed in a small interpreter (``-I -S``, as a fork server or supervisor is): a fork of
#: this one, with its imports, costs more than the fence and varies more.
_FENCE = r"""
import os, statistics, sys, time
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import confine
rounds = int(sys.argv[2])
build, ways = [], {"restrict": [], "apply": [], "bare": []}
for _ in range(rounds):
    t0 = time.perf_counter()
    fence = confine.build()
    build.append(time.perf_counter() - t0)
    for way, times in ways.items():
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            if way != "bare":
                getattr(fence, way)()
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - t0)
    fence.close()
ms = lambda xs: f"{statistics.median(xs) * 1000:8.3f} ms"
print(f"build the fence ({fence.rules} rules)   {ms(build)}")
print(f"fork, Landlock, exit             {ms(ways['restrict'])}")
print(f"fork, seccomp+Landlock, exit     {ms(ways['apply'])}")
print(f"fork, exit                       {ms(ways['bare'])}")
"""


def _fence(rounds: int) -> None:
    why = confine.unavailable()
    if why is not None:
        print(f"fence: skipped: {why}")
        return
    cmd = [sys.executable, "-I", "-S", "-c", _FENCE, confine.__file__, str(rounds)]
    print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout, end="")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    main(ap.parse_args().rounds)
