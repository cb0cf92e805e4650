"""campaigns/bytecode.py: the campaign's one line when its processes would compile the
package again (PYTHONDONTWRITEBYTECODE set, no bytecode), and silence otherwise."""

from __future__ import annotations

import compileall
import os
from pathlib import Path

from durable_spaces.campaigns.bytecode import notice, stale_modules


def package(tmp_path: Path) -> Path:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for rel in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py"):
        (pkg / rel).write_text("X = 1\n")
    return pkg


def test_modules_without_bytecode_are_counted_and_named(tmp_path: Path) -> None:
    pkg = package(tmp_path)
    assert stale_modules(pkg) == 4
    line = notice(pkg, dont_write=True)
    assert line is not None and "4 modules" in line and "compileall" in line


def test_compiled_bytecode_or_a_python_that_writes_it_says_nothing(tmp_path: Path) -> None:
    pkg = package(tmp_path)
    assert notice(pkg, dont_write=False) is None  # Python writes it on the first import
    assert compileall.compile_dir(pkg, quiet=1)
    assert stale_modules(pkg) == 0
    assert notice(pkg, dont_write=True) is None


def test_a_source_newer_than_its_bytecode_is_stale(tmp_path: Path) -> None:
    pkg = package(tmp_path)
    assert compileall.compile_dir(pkg, quiet=1)
    later = (pkg / "a.py").stat().st_mtime + 10
    os.utime(pkg / "a.py", (later, later))
    assert stale_modules(pkg) == 1
