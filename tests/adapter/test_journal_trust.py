"""When transactional mode's scans may trust a change journal, end to end through the
adapter (issue 34, items 2-4): a mount inside the workspace, whenever it was made, makes
the journal in the Space (``backends/spacesd/guest_journal.pl``) untrusted, as it makes
the host's; the image then still follows the Space.

A real harness, real daemons; the image is compared with what the Space's daemon itself
sees (its own ``find``, no journal), since a mount in the daemon's namespace is not
visible from this host.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from wrapped_harness import wrapped_harness

from durable_spaces.adapter import image_log
from durable_spaces.backends import unavailable_reason
from durable_spaces.backends.spacesd.space import SpacesdSpace
from durable_spaces.space import PathTable
from durable_spaces.testing import run_call_list


async def daemon_view(space: Any) -> PathTable:
    """The Space as its daemon's own scan finds it (a new object: no cache, no journal)."""
    other = SpacesdSpace(
        space.name, space.root, space.instance_id, space._url, space._token, space._probe,
        user=space._user, sdk_home=space._sdk_home,
    )  # fmt: skip
    other._guest.unavailable = "the oracle scans without a journal"
    try:
        return await other.scan()
    finally:
        await other.close()


def _files(table: PathTable) -> dict[str, tuple[str, str | None, str | None]]:
    return {p: (e.kind, e.sha256, e.target) for p, e in table.items()}


def _needs(backend: str) -> None:
    if (why := unavailable_reason(backend)) is not None:
        pytest.skip(f"backend {backend} cannot run here: {why}")
    if backend == "spacesd":
        from durable_spaces.backends.spacesd.daemon import unshare_reason

        if (why := unshare_reason()) is not None:  # the mount must stay in the Space
            pytest.skip(f"no namespaces for the Space (its mounts would be this host's): {why}")


@pytest.mark.spacesd
@pytest.mark.parametrize("host_scan", ["0", "1"])
def test_an_overlay_mounted_inside_the_workspace_is_never_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_scan: str
) -> None:
    """A call mounts an overlay at ``ov`` whose upper directory is outside the workspace;
    later writes there raise no event in the workspace. Every later helper must refuse
    to vouch (not take the mount as its baseline), so the scans are the daemon's own and
    the image holds what the Space shows. With the host scan on, the host journal
    refuses the mount and the helper answers: the same rule."""
    _needs("spacesd")
    monkeypatch.setenv("DS_HOST_SCAN", host_scan)
    out = tmp_path / "outside"
    out.mkdir()
    o = str(out)
    calls: list[tuple[str, Any]] = [
        (
            "bash",
            {
                "command": f"mkdir -p {o}/lower {o}/upper {o}/work ov && printf orig > "
                f"{o}/lower/f && mount -t overlay overlay -o lowerdir={o}/lower,"
                f"upperdir={o}/upper,workdir={o}/work ov"
            },
        ),
        ("bash", {"command": "cat ov/f"}),
        ("bash", {"command": f"printf evil > {o}/upper/f && printf g > {o}/upper/g"}),
        ("bash", {"command": "true"}),
        ("bash", {"command": "cat ov/f ov/g"}),
    ]

    async def go() -> None:
        async with wrapped_harness(tmp_path, "spacesd", "transactional", calls) as (h, durable):
            conv, results = await run_call_list(h)
            assert [r["status"] for r in results] == ["ok"] * len(calls), results
            space = await durable.space(conv.id)
            seen = await daemon_view(space)
            assert "ov/g" in seen  # the Space shows the upper directory's new file
            assert _files(image_log.table(h, conv.id)) == _files(seen)
            assert space.scan_stats["guest_journal"] == 0  # no helper ever vouched

    asyncio.run(go())
