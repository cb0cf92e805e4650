"""The product needs none of the lab's packages (pyproject's ``lab`` extra): every module of
its rooms imports in an interpreter where pandas, matplotlib, typer, rich, hypothesis and
mfusepy cannot be imported, and the command line says in one line which extra it needs.
The integrations' framework modules import their framework, which is their own extra.
(``tests/integrations/test_clean_install.py`` installs the wheel alone for real.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import durable_spaces

PACKAGE = Path(durable_spaces.__file__).parent
LAB = ("pandas", "matplotlib", "typer", "rich", "hypothesis", "mfusepy")
PRODUCT = ("harness", "adapter", "backends", "cluster", "drive", "host", "integrations")
#: Modules of the product that import a framework (each its own extra) or run only as a
#: separate program's entry point.
OWN_EXTRA = {
    "durable_spaces.integrations.langgraph",
    "durable_spaces.integrations.openai_agents",
    "durable_spaces.integrations.pydantic_ai",
}

BLOCK = f"""
import sys
class _NoLab:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {LAB!r}:
            raise ImportError(f"no {{name}} here (the lab extra is not installed)")
sys.meta_path.insert(0, _NoLab())
"""


def product_modules() -> list[str]:
    out = [f"durable_spaces.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"]
    for room in PRODUCT:
        for p in sorted((PACKAGE / room).rglob("*.py")):
            parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name not in OWN_EXTRA and "__main__" not in parts:
                out.append(name)
    return out


def imports_without_the_lab(modules: list[str]) -> subprocess.CompletedProcess[str]:
    code = BLOCK + "import importlib\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    return subprocess.run(
        [sys.executable, "-c", code, *modules], capture_output=True, text=True, check=False
    )


def test_the_check_can_fail() -> None:
    """A module of the lab's (its reports import pandas) does not import there."""
    done = imports_without_the_lab(["durable_spaces.reports.tables"])
    assert done.returncode != 0 and "the lab extra is not installed" in done.stderr


def test_every_product_module_imports_without_the_lab() -> None:
    modules = product_modules()
    assert len(modules) > 100 and "durable_spaces.integrations.threads" in modules
    done = imports_without_the_lab(modules)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_command_without_the_lab_says_which_extra_in_one_line() -> None:
    # As where the extra is missing: find_spec finds none of them (main looks that way).
    code = (
        "import importlib.util\n"
        "real = importlib.util.find_spec\n"
        f"importlib.util.find_spec = lambda n, *a: None if n in {LAB!r} else real(n, *a)\n"
        "from durable_spaces.cli import main\nmain()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "host", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "durable-spaces: error: the command line needs the lab extra (typer, rich, pandas, "
        "matplotlib not installed): pip install 'durable-spaces[lab]'"
    ]
