"""The backends' imports go one way and never in a circle.

Read from the source (every ``import``, at module level, inside functions and under
``TYPE_CHECKING`` alike, since a lazy or type-only import back is still a circle a
reader must untangle): backends import ``durable_spaces.space``/``space_types``/``host.boot``,
``errors``, ``host.mounts``, ``host.cgroup``, ``host.proc_start``, ``settings``,
``chaos.failpoints``/``chaos.mutants`` and each other, nothing of the adapter, the harness
or the campaigns; the protocol modules import only ``errors``.
A package ``__init__`` re-exporting its own submodules is not counted as an edge from
those submodules back to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from import_graph import circles

import durable_spaces

PKG = Path(durable_spaces.__file__).parent
ALLOWED = (
    "durable_spaces.backends",
    "durable_spaces.space",
    "durable_spaces.space_types",
    "durable_spaces.host.boot",  # the host's boot id, a Space may report (HostBoot)
    "durable_spaces.errors",
    "durable_spaces.host.mounts",  # the host's mount tables (what inotify sees), no deps
    "durable_spaces.host.inotify",  # inotify_simple, its libc found without ldconfig, no deps
    "durable_spaces.host.cgroup",  # a cgroup v2 this process made, killed whole (imports errors)
    "durable_spaces.host.bounded",  # the one bounded reader of files from outside (imports errors)
    "durable_spaces.host.files",  # what kind of file a path is, in words (no deps)
    "durable_spaces.switches",  # the DS_* on/off switches, read one way (imports errors)
    "durable_spaces.settings",  # the product's DS_* settings, one frozen value (imports errors)
    "durable_spaces.host.proc_start",  # a process's start since boot (its identity), no deps
    "durable_spaces.host.files",  # a mode's file type, a directory's fsync, no deps
    "durable_spaces.host.ports",  # a free TCP port, no deps
    "durable_spaces.chaos.failpoints",
    "durable_spaces.chaos.mutants",
)


def _name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
    base = PKG.parent.joinpath(*module.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imports(path: Path) -> set[str]:
    """The ``durable_spaces`` modules ``path`` imports anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if _exists(sub) else node.module)
    return {m for m in out if m.split(".")[0] == "durable_spaces"}


def graph(paths: list[Path]) -> dict[str, set[str]]:
    g = {_name(p): imports(p) for p in paths}
    for mod, deps in g.items():
        deps.discard(mod)
        for dep in list(deps):
            if mod.startswith(dep + "."):  # a submodule importing its own package
                deps.discard(dep)
    return g


def _modules() -> list[Path]:
    return [*sorted((PKG / "backends").rglob("*.py")), PKG / "space.py", PKG / "space_types.py"]


def test_backends_import_only_the_protocol_errors_and_chaos() -> None:
    bad = {
        f"{mod} imports {dep}"
        for mod, deps in graph(_modules()).items()
        for dep in deps
        if not any(dep == a or dep.startswith(a + ".") for a in ALLOWED)
    }
    assert not bad, sorted(bad)


def test_the_protocol_imports_no_backend() -> None:
    g = graph([PKG / "space.py", PKG / "space_types.py"])
    assert g["durable_spaces.space_types"] <= {"durable_spaces.errors"}
    assert g["durable_spaces.space"] <= {"durable_spaces.errors", "durable_spaces.space_types"}


def test_no_import_circles_among_the_backends() -> None:
    assert circles(graph(_modules())) == []


def test_a_circle_is_seen() -> None:
    """The detector itself (so the test above can fail)."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(g) == [["a", "b", "c"]]
