"""The suite's own layout: pytest's default import mode (rootdir-relative basenames for
directories without ``__init__.py``) refuses two test modules of the same name, and then
the whole run errors. The backends' and the campaigns' ``test_layering.py`` did this."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name_outside_packages() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if not (path.parent / "__init__.py").exists():
            seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"test modules pytest cannot both import: {clashes}"
