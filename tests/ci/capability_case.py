"""Not collected by the suite (no ``test_`` prefix): ``test_needs.py`` runs pytest on it,
with and without ``CI=true``, to see the hook of ``tests/conftest.py`` at work."""

from __future__ import annotations

import pytest
from needs import need

from durable_spaces.campaigns.capabilities import CAPABILITIES, Capability


def absent() -> str:
    return "no machine has it"


CAPABILITIES["absent"] = Capability("absent", "what no machine has", f"{__name__}:absent")


def test_calls_need() -> None:
    need("absent")


@pytest.mark.absent
def test_is_marked() -> None:
    pass


def test_skips_for_a_reason_of_its_own() -> None:
    pytest.skip("a kernel feature this test probes for itself")


@pytest.mark.fuse
def test_needs_what_this_machine_may_have() -> None:
    pass
