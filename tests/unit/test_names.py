"""Names that explain themselves, read from the package's source (``ast``): no two classes
share a name, nor a class and a type alias (a reader who meets ``Host`` must not have to
ask which of four); no ``self.<one letter>`` attribute is set
(``self.d.tx.outcome_update(self.h, ...)`` makes the reader keep a table in their head);
and no module imports another of the same file name (``harness/state.py`` importing
``adapter/state.py`` reads as importing itself).
Each check is proved able to fail on a planted case, as ``test_house.py``'s are."""

from __future__ import annotations

import ast
from collections import defaultdict

from test_house import GRAPH, MODULES


def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text())


TREES = {m: _tree(m) for m in MODULES}


def _alias(node: ast.stmt) -> str | None:
    """The name a module-level type alias binds (``Workspace = dict[str, bytes]``, or
    annotated ``TypeAlias``), else None."""
    if (
        isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(node.annotation, ast.Name)
        and node.annotation.id == "TypeAlias"
    ):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Subscript):
            name = target.id
            return name if name[:1].isupper() and not name.isupper() else None
    return None


def shared_class_names(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Each class name defined in more than one place (nested classes included), or
    given to a module-level type alias too (``Verdict``, a check's result, was also the
    adapter's mode verdict) -> the modules that define it."""
    classes: dict[str, list[str]] = defaultdict(list)
    aliases: dict[str, list[str]] = defaultdict(list)
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name].append(module)
        for stmt in tree.body:
            if (name := _alias(stmt)) is not None:
                aliases[name].append(module)
    return {
        name: sorted(ms + aliases.get(name, []))
        for name, ms in classes.items()
        if len(ms) + len(aliases.get(name, [])) > 1
    }


def test_the_class_check_finds_a_shared_name() -> None:
    """The check can fail: a second ``Host``, as four modules had."""
    assert "HostRecord" not in shared_class_names(TREES)
    planted = {**TREES, "planted": ast.parse("class HostRecord:\n    pass\n")}
    found = shared_class_names(planted)
    assert found["HostRecord"] == ["durable_spaces.cluster.records", "planted"]
    planted = {**TREES, "planted": ast.parse("HostRecord = dict[str, int]\n")}
    found = shared_class_names(planted)
    assert found["HostRecord"] == ["durable_spaces.cluster.records", "planted"]


def test_no_two_classes_of_the_package_share_a_name() -> None:
    shared = shared_class_names(TREES)
    assert not shared, f"class names defined more than once (name each for itself): {shared}"


def one_letter_attributes(tree: ast.Module) -> list[str]:
    """``self.x`` attributes of one letter that ``tree`` sets (``=``, ``+=``, annotated;
    a dataclass's fields are data, named by the format they keep, and not counted)."""
    found: list[str] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    and len(t.attr) == 1
                ):
                    found.append(f"line {t.lineno}: self.{t.attr}")
    return found


def test_the_attribute_check_finds_a_one_letter_attribute() -> None:
    """The check can fail: ``self.p = parts``, as the adapter's keepers had."""
    planted = ast.parse(
        "class Keeper:\n"
        "    def __init__(self, parts):\n"
        "        self.parts = parts\n"
        "        self.p, self.q = parts, 1\n"
    )
    assert one_letter_attributes(planted) == ["line 4: self.p", "line 4: self.q"]


def test_no_one_letter_attribute_is_set_in_the_package() -> None:
    found = {m: f for m, tree in TREES.items() if (f := one_letter_attributes(tree))}
    assert not found, f"one-letter attributes (name what they hold): {found}"


def _file(module: str) -> str | None:
    """The file name of ``module`` (without ``.py``); None for a package."""
    if module in MODULES and MODULES[module].name == "__init__.py":
        return None
    return module.rpartition(".")[2]


def same_named_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for each module ``a`` that imports a module ``b`` of the same file name
    (type-only imports included, as ``test_house.py`` reads them); packages aside."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if _file(a) is not None and _file(a) == _file(b)
    )


def test_the_module_check_finds_a_same_named_import() -> None:
    """The check can fail: ``harness/state.py`` importing ``adapter/state.py``, as the
    harness's handles did of the adapter's state before the adapter's was renamed."""
    graph = {
        "x.adapter.calls": {"x.adapter.state"},
        "x.adapter.state": set(),
        "x.harness.handles": set(),
    }
    assert same_named_imports(graph) == []
    graph["x.harness.state"] = {"x.adapter.state", "x.harness.handles"}
    assert same_named_imports(graph) == ["x.harness.state -> x.adapter.state"]


def test_no_module_imports_another_of_the_same_file_name() -> None:
    found = same_named_imports(GRAPH)
    assert not found, f"modules importing a namesake (rename one): {found}"
