"""A run's record says what its Space lacked on the host (``run._space_missing``): a local
Space without cgroups names ``process.contained_epochs`` and why."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

from durable_spaces.backends.local.backend import LocalBackend
from durable_spaces.campaigns.run import Placement, _space_missing
from durable_spaces.space import CONTAINED_EPOCHS


async def test_a_local_space_without_cgroups_is_recorded_with_why(tmp_path: Path) -> None:
    plain = tmp_path / "not-cgroupfs"
    plain.mkdir()
    backend = LocalBackend(tmp_path / "spaces", cgroup_root=plain)
    await backend.create("sp")
    placement = cast(Placement, SimpleNamespace(backend=backend, name="sp"))
    missing = await _space_missing(placement)
    assert missing is not None and "not a cgroup v2 directory" in missing[CONTAINED_EPOCHS]
    await backend.delete("sp")
    assert await _space_missing(placement) is None  # no Space to ask
