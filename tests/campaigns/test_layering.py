"""How the campaign and chaos modules depend on each other, read from their imports: one
way (cli -> campaigns -> adapter -> harness/space <- backends, chaos at the bottom), no
circles, a scenario never reaching back into the run that drives it, and exactly two
interpreters of what the scripted workload does (the model's and the checker's)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from import_graph import circles as cycles

import durable_spaces

PACKAGE = Path(durable_spaces.__file__).parent
ROOT = PACKAGE.parent


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _target(name: str) -> str | None:
    """The package module ``name`` (``a.b.c`` or an attribute of one) stands for."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """Modules of the package ``module`` imports at run time (anywhere in the file;
    ``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(MODULES[module].read_text())
    typing_only = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for sub in ast.walk(node)
    }
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            t = _target(name) if name.startswith("durable_spaces") else None
            if t is not None and t != module:
                out.add(t)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def _under(prefix: str) -> list[str]:
    """The modules under ``prefix``: never none (a loop over none would check nothing and
    pass, as it would after a folder is renamed)."""
    found = [m for m in MODULES if m == prefix or m.startswith(prefix + ".")]
    assert found, f"no module under {prefix}: the test would check nothing"
    return found


def test_a_prefix_that_names_no_module_fails_rather_than_checking_nothing() -> None:
    assert len(_under("durable_spaces.chaos")) > 3
    with pytest.raises(AssertionError, match="would check nothing"):
        _under("durable_spaces.no_such_room")


def test_no_import_circle_anywhere_in_the_package() -> None:
    """Run-time imports (in functions too: a lazy import back is still a circle a reader
    must untangle), type-only ones left out."""
    assert cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_chaos_is_at_the_bottom() -> None:
    for m in _under("durable_spaces.chaos"):
        # host.bounded (the bounded reader) and host.files (its words) are leaves too:
        # they import only errors and the standard library.
        below = (
            "durable_spaces.chaos",
            "durable_spaces.errors",
            "durable_spaces.host.bounded",
            "durable_spaces.host.files",
        )
        above = {t for t in GRAPH[m] if not t.startswith(below)}
        assert above == set(), m


def test_campaigns_never_import_the_cli_and_scenarios_never_the_run() -> None:
    for m in _under("durable_spaces.campaigns"):
        assert "durable_spaces.cli" not in GRAPH[m], m
    for m in _under("durable_spaces.campaigns.scenarios"):
        assert "durable_spaces.campaigns.run" not in GRAPH[m], m
    # the registry names scenarios without importing them (spec.py reads it)
    assert not any(
        m.startswith("durable_spaces.campaigns.") and m != "durable_spaces.errors"
        for m in GRAPH["durable_spaces.campaigns.scenarios"]
    )


def test_the_workload_is_interpreted_twice_the_model_s_way_and_the_checker_s() -> None:
    """What the scripted workload's calls do to a workspace, and what its server start
    reports, is read in exactly two places, written apart: the model (what the workload
    does) and the checker (what the checker believes it did)."""
    marks = ("printf '%s", "ds-server pid")
    readers = sorted(m for m, p in MODULES.items() if any(mark in p.read_text() for mark in marks))
    assert readers == ["durable_spaces.campaigns.checks.workload", "durable_spaces.harness.models"]
    assert "durable_spaces.harness.models" not in GRAPH["durable_spaces.campaigns.checks.workload"]
