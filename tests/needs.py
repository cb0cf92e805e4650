"""The one way a test says what it needs of the machine (durable_spaces/campaigns/capabilities.py).

A test marked ``@pytest.mark.<capability>`` (``fuse``, ``netns``, ``postgres``,
``spacesd``, ``docker``, ``microvm``: the marker is the capability's name), or calling
``need(name)`` (in a fixture, or for a parameter such as a backend's name), is skipped
when this machine lacks it, with the reason. On CI (``CI=true``) ``tests/conftest.py``
turns such a skip into a failure: CI requires every capability, and a green run must
not hide a whole group of tests skipped. A skip for any other reason (a kernel feature
a test probes for itself, a storage driver) stays a skip.
"""

from __future__ import annotations

import functools

import pytest

from durable_spaces.backends import unavailable_reason
from durable_spaces.campaigns.capabilities import CAPABILITIES


class MissingCapability(pytest.skip.Exception):  # type: ignore[misc,name-defined]
    """A skip because the machine lacks a capability (``capability``: its name)."""

    def __init__(self, capability: str, reason: str, *, module_level: bool = False) -> None:
        super().__init__(f"needs {capability}: {reason}", allow_module_level=module_level)
        self.capability = capability


@functools.cache  # once per test process: probes start daemons, make namespaces
def missing(name: str) -> str | None:
    """Why the machine lacks capability ``name`` (or, for a backend's name that is no
    capability, such as ``local``, why that backend cannot run), or None."""
    if name in CAPABILITIES:
        return CAPABILITIES[name].missing()
    return unavailable_reason(name)


def need(name: str) -> None:
    """Skip the test (raising ``MissingCapability``) unless the machine has ``name``."""
    why = missing(name)
    if why is None:
        return
    if name not in CAPABILITIES:  # a backend no capability covers: a plain skip
        pytest.skip(f"backend {name} cannot run here: {why}")
    raise MissingCapability(name, why)
