"""host_cgroup: a cgroup's kill reaches processes that left their group, session and
environment (what a process group cannot)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from durable_spaces.errors import ConfigError
from durable_spaces.host import cgroup as host_cgroup

needs_cgroup = pytest.mark.cgroup  # tests/needs.py: a skip outside CI, a failure on CI


@needs_cgroup
def test_a_kill_reaches_a_process_that_left_its_session(tmp_path):
    cg = host_cgroup.Cgroup.create(f"test-{os.getpid()}-{time.monotonic_ns()}")
    marker = tmp_path / "late.txt"
    # The child joins the cgroup before it execs, then leaves its session and clears
    # its environment: a process group kill would miss it.
    script = (
        "import os,sys,subprocess;"
        f"open({str(cg.path / 'cgroup.procs')!r},'w').write(str(os.getpid()));"
        f"subprocess.Popen(['setsid','env','-i','sh','-c','sleep 1; echo late > {marker}'],"
        "start_new_session=True)"
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    assert cg.pids(), "the escaped sleeper is in the cgroup"
    assert cg.kill()
    assert cg.pids() == []
    time.sleep(1.5)
    assert not marker.exists()
    cg.remove()
    assert not cg.path.exists()


def test_a_name_that_is_a_path_is_refused():
    with pytest.raises(ConfigError, match="cgroup name"):
        host_cgroup.Cgroup.create("../escape")


@needs_cgroup
def test_remove_takes_the_cgroups_below(tmp_path):
    """A local Space driven from inside the cgroup nests its epochs' cgroups below it."""
    cg = host_cgroup.Cgroup.create(f"test-{os.getpid()}-{time.monotonic_ns()}")
    below = cg.path / "durable-spaces" / "local-0" / "e1"
    below.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "1000"])
    (below / "cgroup.procs").write_text(str(sleeper.pid))
    cg.remove()
    assert sleeper.wait() == -9
    assert not cg.path.exists()
