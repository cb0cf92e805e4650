"""Result lines (SUMMARY, REPRO, UNTESTED, ...) leave in one write each: under CI's
``PYTHONUNBUFFERED=1`` a ``print`` writes its text and its newline apart, and a SUMMARY
teed to a file met the report's stderr line between the two (``...seed_base=probereport:``)."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest

import durable_spaces
from durable_spaces.campaigns import summary
from durable_spaces.probe import whole_probe

PACKAGE = Path(durable_spaces.__file__).parent
#: The modules that write a campaign's, a determinism check's or a probe's result lines.
WRITERS = ("campaigns/runner.py", "campaigns/determinism.py", "probe/whole_probe.py")


class _Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return super().write(s)


@pytest.mark.parametrize("emit", [summary.emit, whole_probe.emit])
def test_a_result_line_is_one_write(emit: object) -> None:
    w = _Writes()
    emit(w, "SUMMARY mode=x runs=1")  # type: ignore[operator]
    assert w.calls == ["SUMMARY mode=x runs=1\n"]


@pytest.mark.parametrize("module", WRITERS)
def test_no_result_line_is_printed(module: str) -> None:
    """Every line to the result stream goes through ``emit`` (a ``print(..., file=w)``
    would split it again)."""
    tree = ast.parse((PACKAGE / module).read_text())
    printed = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
        and any(k.arg == "file" for k in node.keywords)
    ]
    assert not printed, f"{module}: print(..., file=...) at lines {printed}"
