"""The house rules of the whole package that its import graph and its files show: no import
circle at all, type-only imports (``if TYPE_CHECKING:``) included, because a circle
through annotations is still two modules a reader must read together; and no module over
``MAX_LINES`` lines (one idea a module). ``tests/campaigns/test_layering.py`` checks the
run-time graph only, with the direction of its rooms."""

from __future__ import annotations

import ast
from pathlib import Path

from import_graph import circles

import durable_spaces

PACKAGE = Path(durable_spaces.__file__).parent
ROOT = PACKAGE.parent
MAX_LINES = 500


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
    """Every module of the package ``module`` imports: at the top, in functions, and under
    ``if TYPE_CHECKING:`` alike; relative imports resolved."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            names = [f"{base}.{a.name}" for a in node.names]
        for name in names:
            t = _target(name) if name.startswith("durable_spaces") else None
            if t is not None and t != module:
                out.add(t)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def _edges(found: list[list[str]]) -> list[str]:
    """Each circle with the imports that make it, for the failure message."""
    return ["; ".join(f"{m} -> {sorted(GRAPH[m] & set(c))}" for m in c) for c in found]


def test_the_graph_is_read_type_only_imports_included() -> None:
    """Guards the reading itself: a type-only import must be an edge, or the test below
    would pass over the very circles it exists for."""
    assert len(MODULES) > 100
    assert "durable_spaces.harness.handles" in GRAPH["durable_spaces.adapter.space_state"]


def test_circles_finds_a_type_only_circle() -> None:
    """The check can fail: a graph with a circle closed by a type-only import, as the
    adapter's calls -> durable -> space_env -> durable had, is found."""
    graph = {
        "calls": {"state"},
        "durable": {"calls", "space_env", "state"},
        "space_env": {"durable"},  # the type-only import back
        "state": set(),
    }
    assert circles(graph) == [["durable", "space_env"]]
    graph["calls"].add("durable")
    assert circles(graph) == [["calls", "durable", "space_env"]]


def test_no_import_circle_in_the_package_type_only_imports_included() -> None:
    found = circles(GRAPH)
    assert not found, "import circles:\n" + "\n".join(_edges(found))


def _lines(module: str) -> int:
    return len(MODULES[module].read_text().splitlines())


def over_the_limit(lengths: dict[str, int]) -> dict[str, int]:
    """The modules of ``lengths`` (module -> lines) over ``MAX_LINES``."""
    return {m: n for m, n in lengths.items() if n > MAX_LINES}


def test_the_line_check_finds_a_module_over_the_limit() -> None:
    """The check can fail: a module one line over, as ``backends/local/local_space.py`` was."""
    lengths = {"durable_spaces.backends.local.local_space": MAX_LINES + 1, "small": MAX_LINES}
    assert over_the_limit(lengths) == {"durable_spaces.backends.local.local_space": MAX_LINES + 1}


def test_no_module_is_over_the_line_limit() -> None:
    over = over_the_limit({m: _lines(m) for m in MODULES})
    assert not over, f"modules over {MAX_LINES} lines (split each along an idea): {over}"


#: The lab's rooms (ARCHITECTURE.md): the product never imports them, but for the
#: failpoints (``chaos/failpoints.py``, their names ``chaos/points.py``) and the mutants
#: (``chaos/mutants.py``) that the product's own code hits and consults; the command line
#: (``cli/``) is the edge that joins both sides.
LAB = ("chaos", "campaigns", "reports", "probe")
LAB_HOOKS = {
    "durable_spaces.chaos",  # the package itself, for ``from durable_spaces.chaos import x``
    "durable_spaces.chaos.failpoints",
    "durable_spaces.chaos.points",
    "durable_spaces.chaos.mutants",
}
EDGE = ("cli",)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def product_imports_of_the_lab(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for each product module ``a`` that imports a lab module ``b``."""
    return sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if _room(m) not in LAB + EDGE
        for t in targets
        if _room(t) in LAB and t not in LAB_HOOKS
    )


def test_the_line_check_finds_a_product_module_importing_the_lab() -> None:
    """The check can fail: ``cluster/drive.py`` importing the lab's coordinator, as it did."""
    graph = {**GRAPH, "durable_spaces.cluster.drive": {"durable_spaces.campaigns.agent"}}
    assert product_imports_of_the_lab(graph) == [
        "durable_spaces.cluster.drive -> durable_spaces.campaigns.agent"
    ]
    assert "durable_spaces.campaigns.cluster.lab" in MODULES  # the lab's cluster room exists


def test_the_product_never_imports_the_lab() -> None:
    found = product_imports_of_the_lab(GRAPH)
    assert not found, "product -> lab imports:\n" + "\n".join(found)
