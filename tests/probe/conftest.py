"""The probe tests' fixtures (helpers.py)."""

from __future__ import annotations

from tests.probe.helpers import no_leftovers

__all__ = ["no_leftovers"]
