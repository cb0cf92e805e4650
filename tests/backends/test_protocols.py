"""Every registered backend satisfies ``SpaceBackend`` at runtime, and exactly the optional
protocols (``Faults``, ``MachineCheckpoints``) the registry's ``CLAIMS`` lists for it.

mypy checks the same statically (each backend module's ``TYPE_CHECKING`` block); this is
what a caller's ``isinstance`` sees. The check needs no running backend: a protocol check
looks at the class's members, so an instance made without ``__init__`` is enough, and the
test runs (never skips) where Docker or QEMU is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_spaces import backends
from durable_spaces.adapter.checkpoints.snapshots import SandboxSnapshots
from durable_spaces.errors import ConfigError
from durable_spaces.space import Faults, MachineCheckpoints, SpaceBackend

OPTIONAL = (Faults, MachineCheckpoints)


def _bare(name: str) -> object:
    """An instance of backend ``name``'s class without running its ``__init__``."""
    cls = backends.backend_class(name)
    return cls.__new__(cls)


def test_every_registered_backend_states_its_claims() -> None:
    assert set(backends.CLAIMS) == set(backends.BACKENDS)
    for claims in backends.CLAIMS.values():
        assert set(claims) <= set(OPTIONAL)


@pytest.mark.parametrize("name", list(backends.BACKENDS))
def test_backend_satisfies_the_protocols_it_claims(name: str) -> None:
    b = _bare(name)
    assert isinstance(b, SpaceBackend), f"{name} is not a SpaceBackend"
    has = {p for p in OPTIONAL if isinstance(b, p)}
    claimed = set(backends.CLAIMS[name])
    assert has >= claimed, f"{name} claims {sorted(p.__name__ for p in claimed - has)}"
    assert has <= claimed, f"{name} has {sorted(p.__name__ for p in has - claimed)} unclaimed"


def test_a_backend_missing_a_method_fails_the_check() -> None:
    """The runtime check sees a missing member (so the test above can fail)."""

    class Half:
        kind = "half"

        async def create(self, name: str) -> None: ...

        async def restart(self, name: str) -> None: ...

    assert not isinstance(Half(), SpaceBackend)
    assert not isinstance(Half(), Faults)


def test_sandbox_snapshots_refuse_a_backend_without_machine_checkpoints(
    state_dir: Path,
) -> None:
    local = backends.open_backend("local", state_dir)
    with pytest.raises(ConfigError, match="MachineCheckpoints"):
        SandboxSnapshots(local)
