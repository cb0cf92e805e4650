"""The prose of the repository's code: every docstring and every block of comment lines,
for the tests that hold rules over what the code's own words say
(``tests/unit/test_no_timings_in_docstrings.py``, ``tests/unit/test_no_diary_words.py``)."""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path


def python_texts(source: str) -> list[tuple[int, str]]:
    """Every docstring (a string standing as a statement: modules', classes', functions'
    and attributes') and every block of comment lines, with its first line."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            out.append((node.lineno, node.value.value))
    block: list[str] = []
    start = last = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        if block and line != last + 1:
            out.append((start, "\n".join(block)))
            block = []
        if not block:
            start = line
        block.append(tok.string.lstrip("#:").strip())
        last = line
    if block:
        out.append((start, "\n".join(block)))
    return out


def script_texts(source: str) -> list[tuple[int, str]]:
    """The comment blocks of a shell or Perl script (``#`` to the end of a line that
    holds nothing else)."""
    out: list[tuple[int, str]] = []
    block: list[str] = []
    start = 0
    for n, line in enumerate([*source.splitlines(), ""], 1):
        text = line.strip()
        if text.startswith("#") and not text.startswith("#!"):
            if not block:
                start = n
            block.append(text.lstrip("#").strip())
        elif block:
            out.append((start, "\n".join(block)))
            block = []
    return out


def code_texts(root: Path) -> Iterator[tuple[Path, int, str]]:
    """(file, first line, text) for every docstring and comment block under ``root``:
    Python modules, and the Perl and shell scripts beside them."""
    for path in sorted(root.rglob("*")):
        if path.suffix == ".py":
            texts = python_texts(path.read_text())
        elif path.suffix in (".pl", ".sh"):
            texts = script_texts(path.read_text())
        else:
            continue
        for line, text in texts:
            yield path, line, text
