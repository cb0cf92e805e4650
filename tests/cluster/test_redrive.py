"""Sessions re-driven across hosts and coordinators: real PostgreSQL, real cua-spacesd on
hosts in network namespaces, coordinators and drivers as processes."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import psutil
import pytest

from durable_spaces.backends.spacesd import SpacesdBackend
from durable_spaces.campaigns.checker import History, check_all
from durable_spaces.campaigns.checks.effects import diagnose
from durable_spaces.campaigns.checks.workload import interpret
from durable_spaces.campaigns.cluster.lab import CLAIM_TTL, wait_for
from durable_spaces.cluster.host import local_name
from durable_spaces.errors import LeaseLostError, LogError


@pytest.mark.parametrize("backend", ["spacesd", "local"])
def test_two_hosts_one_session_driven_to_done_across_a_driver_kill(
    cluster: Any, backend: str
) -> None:
    # local Spaces are directories: reachable here only because the drivers run on the
    # same machine as the namespaces (the same filesystem)
    cluster.host("h1", backend)
    cluster.host("h2", backend)
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
    check(cluster, "s1", "sp1")
    print(f"resume after a driver kill: {resumed.detail['unix_ms'] - killed:.0f} ms")


def test_a_host_lost_mid_session_its_space_placed_again_and_rebuilt_from_the_log(
    cluster: Any,
) -> None:
    cluster.host("h1")
    cluster.coordinator("c1")
    cluster.submit("s1", "sp1", "lost1", calls=8, sleep=1.0)
    cluster.wait_first_step("s1", 1)
    assert cluster.store.space("sp1").host_id == "h1"
    cluster.host("h2")  # joins later: the Space stays where it is until h1 is lost
    wait_for_results(cluster, "s1", 2)
    cluster.lose("h1")  # every process of the namespace SIGKILLed, the namespace deleted
    lost_ms = time.time() * 1000
    s = cluster.wait_session("s1")
    assert (s.state, s.reason) == ("done", "")
    sp = cluster.store.space("sp1")
    assert (sp.host_id, sp.generation, sp.restored_from) == ("h2", 2, "from-scratch")
    assert sp.placement_reason == "host h1 lost"
    placed = [(e.host, e.detail["generation"]) for e in cluster.events("space_placed")]
    assert placed == [("h1", 1), ("h2", 2)]
    kinds = [e.detail.get("driver_kind") for e in cluster.events("driver_recovery", "s1")]
    assert "reimaged" in kinds, kinds  # the empty new Space was rebuilt from the log's image
    # the first driver halted; no driver was started on the dead address: the next one
    # waited for the new placement and finished
    exits = [(e.detail["epoch"], e.detail["code"]) for e in cluster.events("driver_exited", "s1")]
    assert [code for _, code in exits] == [1, 0], exits
    check(cluster, "s1", "sp1")
    placed_at = cluster.events("space_placed")[-1].at.timestamp() * 1000
    print(f"lost host's Space placed again after {placed_at - lost_ms:.0f} ms")


def wait_for_results(cluster: Any, session: str, n: int) -> None:
    """Until the session's log holds ``n`` tool results."""

    def enough() -> bool:
        try:
            return len(cluster.history(session).results) >= n
        except LogError:  # not written yet
            return False

    wait_for(f"{n} results in {session}'s log", enough)


def test_a_coordinator_sigkilled_mid_session_another_takes_over_after_the_claim_lapses(
    cluster: Any,
) -> None:
    cluster.host("h1")
    c1 = cluster.coordinator("c1")
    cluster.submit("s1", "sp1", "coord1", calls=16, sleep=1.0)
    cluster.wait_first_step("s1", 1)
    cluster.coordinator("c2")  # idle: every session is claimed by c1
    wait_for_results(cluster, "s1", 1)
    c1.send_signal(signal.SIGKILL)  # its driver (epoch 1) is left running, an orphan
    c1.wait(10)
    killed_at = time.time()
    second = wait_for("c2's drive", lambda: cluster.events("epoch_issued", "s1")[1:], 60)[0]
    s = cluster.wait_session("s1")
    assert (s.state, s.claimed_by) == ("done", "c2")
    claims = [
        (e.detail["coordinator"], e.detail["previous"]) for e in cluster.events("session_claimed")
    ]
    assert claims == [("c1", None), ("c2", "c1")]
    # not before c1's claim lapsed: a TTL after its last renewal, which came at most a
    # third of the TTL before the kill
    assert second.at.timestamp() - killed_at >= CLAIM_TTL * 2 / 3 - 0.1
    issued = [e.detail["epoch"] for e in cluster.events("epoch_issued", "s1")]
    assert issued == sorted(set(issued))  # strictly increasing across coordinators
    launched = [e for e, _ in cluster.drivers("s1")]
    assert launched == issued  # exactly one driver per epoch
    # The orphan (epoch 1, lease token 1) stopped: fenced by the store refusing its lease
    # renewal or by the log refusing its next commit, or halted when the new epoch killed
    # its command in the Space, whichever came first (it added nothing: check() below).
    orphan = dict(cluster.drivers("s1"))[1]
    wait_for("the orphan to exit", lambda: not psutil.pid_exists(orphan) or _zombie(orphan))
    said = (cluster.sessions.state_dir("s1") / "drivers" / "epoch-1.log").read_text()
    stops = ("durable-spaces driver: fenced:", "durable-spaces driver: halted:",
             "durable-spaces driver: orphaned:")  # fmt: skip
    assert any(x in said for x in stops), said[-2000:]
    # Its superseded token is refused everywhere, and each refusal is counted.
    before = len(cluster.events("lease_refused"))
    with pytest.raises(LeaseLostError, match="superseded by token 2"):
        cluster.store.connect("sp1", "s1", 1)
    with pytest.raises(LeaseLostError):
        cluster.store.renew_lease("sp1", "s1", 1)
    refused = cluster.events("lease_refused")[before:]
    assert [(e.detail["op"], e.detail["token"]) for e in refused] == [("connect", 1), ("renew", 1)]
    check(cluster, "s1", "sp1")


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_two_sessions_race_for_one_space_the_second_waits_for_the_first(cluster: Any) -> None:
    cluster.host("h1")
    cluster.coordinator("c1")
    cluster.coordinator("c2")
    cluster.submit("a", "sp1", "racea", calls=6, sleep=1.0)
    cluster.wait_first_step("a", 1)
    cluster.submit("b", "sp1", "raceb", calls=4)
    pending = wait_for(
        "b pending", lambda: (s := cluster.store.session("b")).reason.startswith("held") and s
    )
    assert (pending.state, pending.reason) == ("pending", "held by session:a")
    cluster.kill_driver("a", 1)  # a's second drive takes lease token 2
    a = cluster.wait_session("a")
    b = cluster.wait_session("b")
    assert (a.state, b.state) == ("done", "done")
    tokens = [(e.session, e.detail["token"]) for e in cluster.events("lease_acquired")]
    assert tokens == [("a", 1), ("a", 2), ("b", 3)]
    b_first = cluster.events("epoch_issued", "b")[0]
    assert (b_first.detail["epoch"], b_first.detail["lease_token"]) == (3, 3)
    a_end = cluster.events("session_finished", "a")[0]
    assert b_first.id > a_end.id  # b started only once a had ended
    gap_ms = (b_first.at - a_end.at).total_seconds() * 1000
    # pending is written once per spell, not once per poll (b waited for seconds)
    assert 1 <= len(cluster.events("lease_pending", "b")) <= 2
    # The Space holds a's work, then b's: the two logs applied in that order, each step
    # once. b's own image took in a's files as its starting point.
    ha, hb = cluster.history("a"), cluster.history("b")
    both = History([], None, calls={**ha.calls, **hb.calls}, results=ha.results + hb.results)
    inputs = cluster.inputs("b", "sp1")
    status = {str(r.get("call_id")): str(r.get("status")) for r in both.results}
    assert diagnose(interpret(both), inputs.workspace.nodes, status) == []
    verdicts = check_all(inputs)
    wanted = ["log_intact", "image_equals_workspace", "no_stale_writes", "no_error_results"]
    wanted += ["finished"]
    assert {k: verdicts[k]["valid"] for k in wanted} == dict.fromkeys(wanted, True), verdicts
    assert any(op.get("state") == "done" for c in ha.commits for op in c.ops)  # a finished
    assert len(ha.results) == 6 and len(hb.results) == 4
    print(f"second session started {gap_ms:.0f} ms after the first ended")


def test_the_database_restarts_mid_session(restartable_cluster: Any) -> None:
    cluster = restartable_cluster
    pg = cluster.pg
    cluster.host("h1")
    cluster.coordinator("c1")
    cluster.submit("s1", "sp1", "pgre1", calls=8, sleep=1.0)
    cluster.wait_first_step("s1", 1)
    wait_for_results(cluster, "s1", 2)
    pg.stop("fast")
    time.sleep(1.5)
    pg.start()
    cluster.kill_driver("s1", 1)  # the next epoch comes from the restarted database
    s = cluster.wait_session("s1")
    assert s.state == "done"
    issued = [e.detail["epoch"] for e in cluster.events("epoch_issued", "s1")]
    assert issued == [1, 2]
    assert cluster.store.space("sp1").generation == 1
    check(cluster, "s1", "sp1")


@pytest.mark.parametrize("shared_store", [False, True], ids=["no_store", "shared_store"])
def test_checkpoint_mode_after_a_lost_host_needs_a_shared_checkpoint_store(
    cluster: Any, shared_store: bool
) -> None:
    cluster.host("h1")
    cluster.host("h2")
    cluster.coordinator("c1")
    store = cluster.root / "checkpoints" if shared_store else None
    cluster.submit(
        "s1", "sp1", "ckpt1", calls=8, sleep=1.0, mode="checkpoint", checkpoint_dir=store
    )
    wait_for_results(cluster, "s1", 2)
    cluster.lose(cluster.store.space("sp1").host_id)
    s = cluster.wait_session("s1")
    sp = cluster.store.space("sp1")
    assert (sp.generation, sp.restored_from) == (2, "from-scratch")
    if shared_store:
        assert (s.state, s.reason) == ("done", "")
        check(cluster, "s1", "sp1")
    else:  # the reference's limit: its checkpoints were inside the lost Space
        assert s.state == "failed"
        assert "permanent" in s.reason and "use a CheckpointStore or mode transactional" in s.reason


@pytest.mark.docker
def test_a_docker_host_provides_a_space_through_its_forward(cluster: Any) -> None:
    # docker publishes on this machine's loopback: its agent runs here, on the bridge's
    # address, and forwards a port of it to the container
    cluster.host("h1", "docker", root_ns=True)
    cluster.host("h2")
    cluster.coordinator("c1")
    cluster.submit("s1", "sp1", "dock1", calls=8)
    cluster.wait_first_step("s1", 1, timeout=120)
    sp = cluster.store.space("sp1")
    assert sp.host_id == "h1" and sp.address is not None
    assert "user=cua" in sp.address and sp.address.startswith(f"http://{cluster.lab.gateway}:")
    cluster.kill_driver("s1", 1)
    s = cluster.wait_session("s1", timeout=180)
    assert (s.state, s.reason) == ("done", "")
    check(cluster, "s1", "sp1")


def test_a_frozen_host_is_declared_lost_and_its_driver_halts(cluster: Any) -> None:
    # SIGSTOP, not SIGKILL: the host's connections stay open and silent, so the driver's
    # calls to it may never return; the store declaring the host lost must stop it
    cluster.host("h1")
    cluster.coordinator("c1")
    cluster.submit("s1", "sp1", "frozen1", calls=8, sleep=1.0)
    cluster.wait_first_step("s1", 1)
    cluster.host("h2")
    wait_for_results(cluster, "s1", 2)
    cluster.hosts["h1"].ns.freeze()
    s = cluster.wait_session("s1")
    assert (s.state, s.reason) == ("done", "")
    sp = cluster.store.space("sp1")
    assert (sp.host_id, sp.generation, sp.placement_reason) == ("h2", 2, "host h1 lost")
    exits = [(e.detail["epoch"], e.detail["code"]) for e in cluster.events("driver_exited", "s1")]
    assert [code for _, code in exits] == [1, 0], exits  # halted; none on the dead address
    check(cluster, "s1", "sp1")


def test_a_space_removed_under_a_live_driver_is_placed_again(cluster: Any) -> None:
    h1 = cluster.host("h1")
    cluster.coordinator("c1")
    cluster.submit("s1", "sp1", "removed1", calls=8, sleep=1.0)
    cluster.wait_first_step("s1", 1)
    wait_for_results(cluster, "s1", 2)

    async def remove() -> None:  # an operator removes the sandbox on its (live) host
        backend = SpacesdBackend(h1.state_dir / "spaces", listen_host=h1.ip)
        try:
            await backend.delete(local_name("sp1", 1))
        finally:
            await backend.close()

    asyncio.run(remove())
    s = cluster.wait_session("s1")
    assert (s.state, s.reason) == ("done", "")
    sp = cluster.store.space("sp1")
    assert (sp.generation, sp.restored_from) == (2, "from-scratch")
    assert sp.placement_reason.startswith("the sandbox") and sp.placement_reason.endswith(
        "on host h1"
    )  # the host reported it (asked before the next drive, or in its sweep)
    placed = [(e.host, e.detail["generation"]) for e in cluster.events("space_placed")]
    assert placed == [("h1", 1), ("h1", 2)]  # the host is up: the new copy may go there
    kinds = [e.detail.get("driver_kind") for e in cluster.events("driver_recovery", "s1")]
    assert "reimaged" in kinds, kinds
    check(cluster, "s1", "sp1")


def check(cluster: Any, session: str, space: str) -> None:
    """Every checker verdict of the session's log against its Space's workspace holds."""
    verdicts = check_all(cluster.inputs(session, space))
    bad = {k: v for k, v in verdicts.items() if v.get("valid") is not True}
    assert not bad, bad
