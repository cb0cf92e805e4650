"""Whether every process a campaign starts compiles the package again.

With ``PYTHONDONTWRITEBYTECODE`` set (as on the project's machines) Python reads a
module's bytecode from ``__pycache__`` but never writes it. An install that never
compiled it (``pip install -e`` does not) then makes each worker and driver a campaign
starts compile every module it imports, which lengthened a checkpoint campaign by half
(docs/performance.md). ``make setup`` and ``.ci/run`` compile it; a
campaign started without says so once, on stderr, with the command that fixes it. It
does not compile anything itself: the variable is the user's choice.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import durable_spaces

PACKAGE = Path(durable_spaces.__file__).resolve().parent


def stale_modules(package: Path = PACKAGE) -> int:
    """How many of ``package``'s modules have no bytecode as new as their source."""
    stale = 0
    for src in package.rglob("*.py"):
        try:
            pyc = Path(importlib.util.cache_from_source(os.fspath(src)))
            if pyc.stat().st_mtime < src.stat().st_mtime:
                stale += 1
        except (OSError, NotImplementedError):
            stale += 1
    return stale


def notice(package: Path = PACKAGE, *, dont_write: bool | None = None) -> str | None:
    """The one line to print, or None when the bytecode is there or Python writes it."""
    if not (sys.dont_write_bytecode if dont_write is None else dont_write):
        return None
    stale = stale_modules(package)
    if stale == 0:
        return None
    return (
        f"durable-spaces: PYTHONDONTWRITEBYTECODE is set and {stale} modules of {package} "
        "have no compiled bytecode, so every driver compiles them again (a third slower "
        f"here); `{sys.executable} -m compileall -q {package}` (or `make setup`) fixes it"
    )
