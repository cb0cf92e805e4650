"""ARCHITECTURE.md is the map, and the map must be true: every module its tree of rooms
names exists in the folder the tree puts it in, every folder of the package is in the
tree, and every path it cites in backquotes (``adapter/checkpoints/snapshots.py``,
``tests/unit/test_house.py``) exists. A module moved or renamed without its line in the
map fails here, with the line to mend."""

from __future__ import annotations

import re
from pathlib import Path

import durable_spaces

PACKAGE = Path(durable_spaces.__file__).parent
ROOT = PACKAGE.parent
MAP = ROOT / "ARCHITECTURE.md"

_ROOM = re.compile(r"^(\s*)([\w-]+)/(?:\s|$)")
_FILE = re.compile(r"(?<![\w/.-])([\w-]+\.(?:py|pl|sh|toml))\b")
_CITED = re.compile(r"`([\w./-]+/[\w.-]+\.(?:py|pl|sh|toml|md|json))`")


def tree(text: str) -> tuple[list[str], list[str]]:
    """The rooms (folders, from the package's root) and the problems of the first code
    block: ``line N: name`` for each file named that is in none of the rooms the line
    stands in (its own folder, or a folder under it the line names)."""
    block = text.split("```", 2)[1].splitlines()[1:]
    rooms: list[str] = []
    missing: list[str] = []
    stack: list[tuple[int, str]] = []  # (indent, folder)
    for n, line in enumerate(block, 2):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        room = _ROOM.match(line)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        here = "/".join(folder for _, folder in stack)
        if room and (ROOT / here / room.group(2)).is_dir():
            stack.append((indent, room.group(2)))
            rooms.append("/".join(folder for _, folder in stack))
            continue
        for name in _FILE.findall(line):
            folder = ROOT / here
            if not (folder / name).exists() and not list(folder.glob(f"*/{name}")):
                missing.append(f"ARCHITECTURE.md, tree line {n}: {here}/{name}")
    return rooms, missing


def cited(text: str) -> list[str]:
    """Each path in backquotes that is neither under the repository's root nor under
    the package."""
    return [
        p
        for p in sorted(set(_CITED.findall(text)))
        if not (ROOT / p).exists() and not (PACKAGE / p).exists()
    ]


def test_the_map_can_fail() -> None:
    """A module the map names that is not there, and a cited path that is not, are
    found; a folder of the package the tree leaves out is seen as missing."""
    text = MAP.read_text()
    planted = text.replace("    entry.py ", "    entered.py ", 1)
    assert planted != text
    assert any(m.endswith("/drive/entered.py") for m in tree(planted)[1])
    assert cited("see `drive/no_such_module.py`") == ["drive/no_such_module.py"]
    rooms, _ = tree(text.replace("  drive/ ", "  drove/ ", 1))
    assert "durable_spaces/drive" not in rooms


def test_every_module_the_tree_names_exists() -> None:
    _, missing = tree(MAP.read_text())
    assert not missing, "the map names modules that are not there:\n" + "\n".join(missing)


def test_every_folder_of_the_package_is_a_room_of_the_tree() -> None:
    rooms, _ = tree(MAP.read_text())
    folders = {
        str(p.parent.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if "recipes" not in p.relative_to(PACKAGE).parts[1:]  # a recipe's own program
    }
    left_out = sorted(folders - set(rooms))
    assert not left_out, f"folders of the package the map's tree leaves out: {left_out}"


def test_every_path_the_map_cites_exists() -> None:
    missing = cited(MAP.read_text())
    assert not missing, f"ARCHITECTURE.md cites paths that are not there: {missing}"
