"""``random``: a schedule drawn from the run's seed, against the adapter in its mode.

The seed draws, per attempt, a failpoint to die at (or to stop at: a pause), a
random-time SIGKILL, driver pauses (most with a takeover) and Space faults (daemon
kill, machine restart, Space removal, a frozen machine) at logical points of the run,
with the campaign's profile (``chaos/schedule.py``). One coordinated session carries it
out; the checks are every run's.
"""

from __future__ import annotations

from durable_spaces.campaigns.scenarios.base import OneSession


class Drawn(OneSession):
    name = "random"


SCENARIO = Drawn()
