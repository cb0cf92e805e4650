"""A daemon's machine seen from the host: waiting for the daemon's health, and the script
that sweeps processes a daemon left behind. Shared by every backend whose daemon runs in
a machine of its own (a container, a VM), which the host cannot look into directly."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from durable_spaces.errors import SpaceUnavailableError


async def wait_http_health(
    port: int,
    timeout: float,
    *,
    interval: float = 0.02,
    give_up: Callable[[], str | None] | None = None,
) -> float:
    """Poll a daemon's ``GET /health`` on loopback until it answers 2xx; return the seconds
    waited. Cheap (no SDK, no token). Only an HTTP answer counts: a port forward may accept
    the connection while nothing listens behind it. ``give_up`` returns a reason to stop
    at once (the machine behind the port died)."""
    t0 = time.monotonic()
    req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    last: object = "no answer"
    while time.monotonic() - t0 < timeout:
        if give_up is not None and (why := give_up()) is not None:
            raise SpaceUnavailableError(why)
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
            try:
                w.write(req)
                await w.drain()
                head = await asyncio.wait_for(r.readline(), 2)
            finally:
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
            if head.startswith(b"HTTP/1.1 2"):
                return time.monotonic() - t0
            last = head.decode(errors="replace").strip() or "empty answer"
        except (TimeoutError, OSError) as e:
            last = e
        await asyncio.sleep(interval)
    raise SpaceUnavailableError(f"cua-spacesd on 127.0.0.1:{port} did not answer: {last}")


def orphan_sweep_script(daemon_pid: str) -> str:
    """A guest shell script that SIGKILLs every process hanging off pid 1 rather than off
    the daemon (``daemon_pid`` is a shell expression giving its pid): what remains of a
    killed daemon's commands and background leftovers of finished ones. The daemon's own
    ``AdvanceEpoch`` only kills the commands it tracks."""
    return (
        f"d=$({daemon_pid})\n"
        + r"""[ -n "$d" ] || exit 3
ps -eo pid=,ppid= | awk -v d="$d" '
  { pp[$1] = $2 }
  END {
    for (p in pp) {
      if (p == 1 || p == d) continue
      q = pp[p]; orphan = 0
      while (q != "" && q != 0) {
        if (q == d) break
        if (q == 1) { orphan = 1; break }
        q = pp[q]
      }
      if (orphan) print p
    }
  }' | xargs -r kill -9 2>/dev/null
exit 0
"""
    )
