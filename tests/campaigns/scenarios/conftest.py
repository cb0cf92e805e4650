"""The scenario tests use the campaign tests' helper modules (``checker_scenes``,
``toy_cli_session``), which live one folder up."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
