"""A process is known by its pid and its start since boot (``durable_spaces/host/proc_start.py``),
so it stays itself when the wall clock is stepped. psutil's ``create_time()`` adds the
boot time of ``/proc/stat`` (``btime``), which a step of the clock moves by whole
seconds; every check below read a live process as gone once ``btime`` moved."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest
from psutil import _pslinux

from durable_spaces.backends.local import procs
from durable_spaces.backends.microvm import qemu
from durable_spaces.drive import coordinator_state
from durable_spaces.host.proc_start import started

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(["sleep", "60"])
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def test_the_start_is_the_one_psutil_counts_from_boot(child: subprocess.Popen[bytes]) -> None:
    since_boot = psutil.Process(child.pid).create_time() - psutil.boot_time()
    assert started(child.pid) == pytest.approx(since_boot, abs=0.02)
    assert started(child.pid) == started(child.pid)


def test_a_later_process_started_later(child: subprocess.Popen[bytes]) -> None:
    time.sleep(0.05)
    later = subprocess.Popen(["sleep", "60"])
    try:
        assert started(later.pid) > started(child.pid)
    finally:
        later.kill()
        later.wait()


def test_a_process_that_is_gone_is_no_such_process() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(psutil.NoSuchProcess):
        started(p.pid)


def test_a_live_process_stays_itself_when_the_clock_is_stepped(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a step of the wall clock does to ``btime`` (a VM restored from a snapshot),
    done to psutil's reading of it: each liveness check still finds the process."""
    recorded = started(child.pid)
    real = _pslinux.boot_time
    monkeypatch.setattr(_pslinux, "boot_time", lambda: real() + 1.0)
    assert procs.alive(child.pid, recorded)  # a local Space's command, its fork server
    assert qemu.alive(child.pid, recorded)  # a microvm's QEMU
    assert coordinator_state.process_alive(child.pid, recorded)  # the lab's driver


def test_a_reused_pid_is_another_process(child: subprocess.Popen[bytes]) -> None:
    recorded = started(child.pid) - 5.0  # the pid's earlier owner
    assert not procs.alive(child.pid, recorded)
    assert not qemu.alive(child.pid, recorded)
    assert not coordinator_state.process_alive(child.pid, recorded)
