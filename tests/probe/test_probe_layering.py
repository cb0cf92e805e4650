"""The probe is lab-side: the product never imports it, and it needs nothing of the
product but the package's errors, the host's cgroups and its bounded reader (and of the
lab, powerfs and its capability check, for the power fault)."""

from __future__ import annotations

import ast
from pathlib import Path

import durable_spaces

PACKAGE = Path(durable_spaces.__file__).parent


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return {m for m in out if m.startswith("durable_spaces")}


def test_only_the_cli_imports_the_probe() -> None:
    users = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
        if "probe" not in p.relative_to(PACKAGE).parts[:1]
        and any(m.startswith("durable_spaces.probe") for m in _imports(p))
    )  # fmt: skip
    assert users == ["cli/probe.py"], users


def test_the_probe_needs_nothing_of_the_product() -> None:
    allowed = (
        "durable_spaces.probe",
        "durable_spaces.errors",
        "durable_spaces.host.cgroup",
        "durable_spaces.host.bounded",
        "durable_spaces.chaos.powerfs",
        "durable_spaces.campaigns.capabilities",
    )
    for p in (PACKAGE / "probe").glob("*.py"):
        bad = [m for m in _imports(p) if not m.startswith(allowed)]
        assert not bad, (p.name, bad)
