"""What the lab needs of a machine, by name, and whether this one has it.

Parts of the test suite and of the CI campaign subset need things a machine may lack: a
FUSE device (powerfs: power losses, slow disks), network namespaces (cluster hosts),
Docker, QEMU (microvm Spaces), PostgreSQL (the cluster's store), the cua-spacesd binary.
Outside CI a test or campaign that needs a missing one is skipped, saying what is
missing; on CI (``CI=true``) every capability listed here is required, and a missing one
fails the build with its reason, so a green CI cannot mean "half of it skipped"
(docs/lab-exit-codes.md). The same list serves pytest (``tests/conftest.py``: a test
marked ``@pytest.mark.<name>``, or calling ``tests.needs.need(name)``) and the shell
(``.ci/lib.sh``: ``python -m durable_spaces.campaigns.capabilities <name>``).

A new requirement is one line in ``CAPABILITIES``: its name (also its pytest marker),
what needs it, and the ``module:function`` that says why it is missing (None when it is
there), imported only when asked.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Capability:
    name: str
    #: What needs it (a marker's description, the line CI prints).
    what: str
    #: ``module:function``: called with ``args``, returns why it is missing, or None.
    probe: str
    args: tuple[str, ...] = ()

    def missing(self) -> str | None:
        """Why this machine lacks it, or None when it has it."""
        module, _, attr = self.probe.partition(":")
        reason: str | None = getattr(importlib.import_module(module), attr)(*self.args)
        return reason


_BACKEND = "durable_spaces.backends:unavailable_reason"
_NETNS = "durable_spaces.cluster.netns:unavailable_reason"
_POSTGRES = "durable_spaces.cluster.pgserver:unavailable_reason"
_FUSE = "durable_spaces.chaos.powerfs:unavailable"

#: Every capability, one line each: a new one (Chromium, Node) is one more line.
CAPABILITIES: dict[str, Capability] = {
    c.name: c
    for c in (
        Capability("fuse", "FUSE (/dev/fuse, libfuse3): powerfs, power and disk faults", _FUSE),
        Capability("netns", "network namespaces and bridges: cluster hosts", _NETNS),
        Capability("postgres", "PostgreSQL's server binaries: the cluster's store", _POSTGRES),
        Capability("spacesd", "the cua-spacesd binary from the cua wheel", _BACKEND, ("spacesd",)),
        Capability("docker", "a running Docker engine and the space image", _BACKEND, ("docker",)),
        Capability("microvm", "QEMU and the microvm guest image", _BACKEND, ("microvm",)),
    )
}


def required(env: Mapping[str, str]) -> bool:
    """Whether every capability is required: on CI (``CI=true``, as CI services set it)."""
    return env.get("CI", "").strip().lower() in ("true", "1", "yes")


def capability(name: str) -> Capability:
    try:
        return CAPABILITIES[name]
    except KeyError:
        raise ValueError(f"unknown capability {name!r}; known: {', '.join(CAPABILITIES)}") from None


def main(argv: Sequence[str]) -> int:
    """``python -m durable_spaces.campaigns.capabilities NAME...``: exit 0 when this
    machine has them all, else 1 with one line per missing one, ``NAME: why``."""
    if not argv:
        print(f"usage: capabilities NAME... (known: {', '.join(CAPABILITIES)})", file=sys.stderr)
        return 2
    code = 0
    for name in argv:
        try:
            why = capability(name).missing()
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        if why is not None:
            print(f"{name}: {why}")
            code = 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
