"""A Space's daemon token per lease (docs/cluster-security.md): once session s2 took sp1's lease,
the token s1's driver was given controls nothing (no command, no epoch advance), and s2's
drivers go on (tests/backends/test_spacesd_token.py: a floor raised past the grant is
taken back at the next lease)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import cua

from durable_spaces.backends.spacesd.runtime import runtime
from durable_spaces.campaigns.cluster.lab import wait_for
from durable_spaces.cluster.address import SpacesdAddress, parse_address
from durable_spaces.cluster.records import SpaceConnection


async def _attack(conn: SpaceConnection, root: str, sdk_home: str) -> list[str]:
    """What a holder of ``conn``'s token tries, as an attacker with a stale token would: the error
    each attempt met (an empty string where it succeeded)."""
    addr = parse_address(conn.address)
    assert isinstance(addr, SpacesdAddress)
    out = []
    try:
        sdk = runtime(sdk_home).sandboxes()
        sb = await sdk.connect_url(addr.url, conn.token.reveal(), "old")
        env = await sb.spacesd(None)
    except Exception as e:
        return [f"connect: {e}"] * 2
    cmd = cua.SpacesdCommand(
        program="sh", args=["-c", "echo pwned > pwned.txt"], cwd=root, epoch=10**12
    )
    for attempt in (
        lambda: env.run(cmd),
        lambda: env.call_json("ProcessService/AdvanceEpoch", json.dumps({"epoch": 10**15})),
    ):
        try:
            await attempt()
            out.append("")
        except Exception as e:
            out.append(str(e))
    return out


def test_a_superseded_leases_token_controls_nothing_and_the_next_session_proceeds(
    cluster: Any, tmp_path: Any
) -> None:
    h1 = cluster.host("h1")
    cluster.coordinator("c1")
    cluster.submit("s1", "sp1", "cred1", calls=4, sleep=0.5)
    cluster.wait_first_step("s1", 1)
    lease = cluster.store.lease("sp1")
    assert lease.holder == "s1"
    s1_conn = cluster.store.connect("sp1", "s1", lease.token)  # what s1's driver was given
    assert cluster.wait_session("s1").state == "done"
    cluster.submit("s2", "sp1", "cred2", calls=6, sleep=1.0)
    first = wait_for("s2's first epoch", lambda: cluster.events("epoch_issued", "s2"))[0]
    cluster.wait_first_step("s2", first.detail["epoch"])
    assert cluster.store.lease("sp1").holder == "s2"
    root = parse_address(cluster.store.space("sp1").address or "").root  # type: ignore[union-attr]
    (tmp_path / "sdk").mkdir(mode=0o700)
    refused = asyncio.run(_attack(s1_conn, root, str(tmp_path / "sdk")))
    assert all("unauthenticated" in r.lower() for r in refused), refused
    s2 = cluster.wait_session("s2")
    assert (s2.state, s2.reason) == ("done", "")
    exits = [e.detail["code"] for e in cluster.events("driver_exited", "s2")]
    assert exits == [0], exits  # not one driver of s2 was fenced or wedged
    inputs = cluster.inputs("s2", "sp1")
    assert "pwned.txt" not in inputs.workspace.nodes
    rotated = [(e.detail["lease"], e.host) for e in cluster.events("space_token_rotated")]
    assert [h for _, h in rotated] == ["h1"] * len(rotated) and len(rotated) >= 1
    assert h1.backend == "spacesd"
