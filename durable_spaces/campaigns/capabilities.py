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
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


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
_NETNS = "durable_spaces.campaigns.cluster.netns:unavailable_reason"
_POSTGRES = "durable_spaces.cluster.pgserver:unavailable_reason"
_FUSE = "durable_spaces.chaos.powerfs:unavailable"
_PROGRAM = "durable_spaces.campaigns.capabilities:program_missing"
_MODULES = "durable_spaces.campaigns.capabilities:modules_missing"
_PI = "durable_spaces.campaigns.capabilities:pi_missing"


def program_missing(name: str, setup: str) -> str | None:
    """None when ``name`` is on PATH; else what installs it."""
    return None if shutil.which(name) else f"{name} is not on PATH ({setup} installs it)"


def modules_missing(*modules: str) -> str | None:
    """None when every module can be imported; else the first that cannot."""
    for m in modules:
        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"no module {m} (pip install -e '.[probe]')"
    return None


def index_missing() -> str | None:
    """None when pip reaches its package index (a download of one small package)."""
    with tempfile.TemporaryDirectory() as d:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-q",
             "-d", d, "setuptools>=77"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    if done.returncode == 0:
        return None
    why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
    return f"pip cannot download from its index: {why[0]}"


def pi_missing() -> str | None:
    """None when the pi recipe's own check passes (Node and Pi installed)."""
    script = Path(__file__).resolve().parents[1] / "probe" / "recipes" / "pi" / "pi.sh"
    done = subprocess.run(["sh", str(script), "check"], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    if done.returncode == 0:
        return None
    why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
    return f"{why[0]} (images/probe/ci-setup.sh installs it)"


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
        Capability(
            "cgroup",
            "a writable cgroup v2: epochs of local Spaces, the probe's machine kill",
            "durable_spaces.host.cgroup:unavailable",
        ),
        Capability(
            "chromium",
            "Debian's chromium, headless: the report test",
            _PROGRAM,
            ("chromium", "images/chromium/ci-setup.sh"),
        ),
        Capability(
            "probe-harnesses",
            "LangGraph, pydantic-ai + DBOS, the OpenAI Agents SDK",
            _MODULES,
            (
                "langgraph",
                "langgraph.checkpoint.sqlite",
                "langchain_openai",
                "pydantic_ai",
                "dbos",
                "agents",
            ),
        ),
        Capability("pi", "Node and the Pi coding agent (npm, a project-local prefix)", _PI),
        Capability(
            "pypi",
            "pip's package index: the clean installs of tests/integrations/test_clean_install.py",
            "durable_spaces.campaigns.capabilities:index_missing",
        ),
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
