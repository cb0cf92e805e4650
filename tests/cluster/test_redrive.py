"""Sessions re-driven across hosts and coordinators: real PostgreSQL, real cua-spacesd on
hosts in network namespaces, coordinators and drivers as processes."""

from __future__ import annotations

from typing import Any


def test_two_hosts_one_session_driven_to_done_across_a_driver_kill(cluster: Any) -> None:
    cluster.host("h1")
    cluster.host("h2")
    cluster.coordinator("c1")
    cluster.submit("s1", "sp1", "kill1", calls=8)
    cluster.wait_first_step("s1", 1)
    killed = cluster.kill_driver("s1", 1)
    resumed = cluster.wait_first_step("s1", 2)
    s = cluster.wait_session("s1")
    assert (s.state, s.reason) == ("done", "")
    assert [e for e, _ in cluster.drivers("s1")] == [1, 2]  # one driver per epoch
    exits = [e.detail["code"] for e in cluster.events("driver_exited", "s1")]
    assert exits == [-9, 0]
    sp = cluster.store.space("sp1")
    assert (sp.generation, sp.restored_from) == (1, "new")  # the Space was never lost
    cluster.check("s1", "sp1")
    print(f"resume after a driver kill: {resumed.detail['unix_ms'] - killed:.0f} ms")
