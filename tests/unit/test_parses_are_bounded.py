"""Every JSON or TOML document the package parses goes through ``host/bounded.py``
(``parse_json``, ``load_json``, ``load_object``, ``parse_toml``, ``load_toml``): a call of
``json.load(s)`` or ``tomllib.load(s)`` anywhere else is a reader whose input can nest
past Python's parsers and end in ``RecursionError`` (a run record did, through every
report), or whose file can be a FIFO that hangs it. The one exception runs before the
package can be imported (stdlib only) and bounds its one read itself."""

from __future__ import annotations

import ast
from pathlib import Path

import durable_spaces

PACKAGE = Path(durable_spaces.__file__).parent
READER = "host/bounded.py"
#: Files that may not import the package, and why each read there is bounded anyway.
STDLIB_ONLY = {
    # ``python -I -S``: reads 4096 bytes at most of its own forkserver.json, opened
    # O_NONBLOCK, and takes RecursionError as "not mine".
    "backends/local/forkserver.py",
}
_PARSERS = {("json", "loads"), ("json", "load"), ("tomllib", "loads"), ("tomllib", "load")}


def unbounded_parses(source: str) -> list[int]:
    """The lines of ``source`` that call ``json.load(s)`` or ``tomllib.load(s)``, by
    attribute or as a name imported from those modules."""
    tree = ast.parse(source)
    imported = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in ("json", "tomllib")
        for a in node.names
        if a.name in ("load", "loads")
    }
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        by_attribute = (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and (f.value.id, f.attr) in _PARSERS
        )
        if by_attribute or (isinstance(f, ast.Name) and f.id in imported):
            out.append(node.lineno)
    return out


def test_every_parse_of_the_package_is_bounded() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == READER or rel in STDLIB_ONLY:
            continue
        found += [f"durable_spaces/{rel}:{n}" for n in unbounded_parses(path.read_text())]
    assert not found, f"parse through durable_spaces/{READER} instead: {found}"


def test_the_rule_can_fail() -> None:
    assert unbounded_parses("import json\nx = json.loads(s)\n") == [2]
    assert unbounded_parses("from json import loads as l\nx = l(s)\n") == [2]
    assert unbounded_parses("import tomllib\nwith open(p) as f:\n    tomllib.load(f)\n") == [3]
    assert unbounded_parses("import json\nx = json.dumps(v)\n") == []


def test_the_exceptions_still_exist() -> None:
    assert (PACKAGE / READER).is_file()
    for rel in STDLIB_ONLY:
        assert unbounded_parses((PACKAGE / rel).read_text()), f"{rel} needs no exception"
