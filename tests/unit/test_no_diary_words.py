"""The documents and the code's docstrings and comments describe the project as it is,
not the history of its making: no issue numbers ("issue 34", "#35", "the issue's
case") and no stops of the work ("this stop", "stop 3"). A reader has neither the issues
nor the stops; what they said belongs in the text itself, and the history in ``git log``.

Checked: README.md, ARCHITECTURE.md and docs/*.md whole, and every docstring and comment
of the package, the benchmarks and the tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_texts import code_texts

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "ARCHITECTURE.md", "docs/*.md")
CODE = ("durable_spaces", "bench", "tests")

DIARY = re.compile(
    r"\bissue\s+#?\d+"  # issue 34, issue #35
    r"|\bissues\s+#?\d+\s*(?:,|and|to)\s*#?\d+"  # issues 4 and 5 (not "issues 11": a verb)
    r"|(?<![\w&#/`'\"=-])#\d+(?![\w:;}])"  # #35 (not a CSS colour, an anchor, "#2:" a count)
    r"|\b(?:the|this|that)\s+issue(?:'s)?\b"  # the case, as this issue asks
    r"|\b(?:this|next|last|previous|earlier|later)\s+stop(?:'s)?\b"  # this stop
    r"|\bstops?\s+\d+\b",  # stop 3
    re.IGNORECASE,
)


def diary_words(text: str) -> list[str]:
    return [m.group(0) for m in DIARY.finditer(" ".join(text.split()))]


def scan_documents(root: Path) -> list[str]:
    found = []
    for pattern in DOCUMENTS:
        for path in sorted(root.glob(pattern)):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                found += [f"{path.relative_to(root)}:{n}: {w}" for w in diary_words(line)]
    return found


def scan_code(root: Path, *rooms: str) -> list[str]:
    return [
        f"{path.relative_to(root)}:{line}: {word}"
        for room in rooms
        for path, line, text in code_texts(root / room)
        if path.resolve() != Path(__file__).resolve()  # its own examples
        for word in diary_words(text)
    ]


@pytest.mark.parametrize(
    "text",
    [
        "What each one trusts, as of issue 34 (items 6 and 7):",
        "the forms issue 13 asks for",
        "as issues 4 and 5 found",
        "fixed in #35",
        "at this stop the README was cut",
        "the issue's case",
        "as this issue asks",
        "Stop 3 measured it.",
    ],
)
def test_a_diary_word_is_found(text: str) -> None:
    assert diary_words(text), text


@pytest.mark.parametrize(
    "text",
    [
        "A coordinator issues one epoch per drive attempt.",
        "its successor never issues 11 again",
        "the stop and the trace succeed (SIGSTOP, PTRACE_ATTACH)",
        "Errors that stop the harness without recording anything.",
        "td,th{border:1px solid #999}",
        "PARTED run-0000: #2: recovery x",
        "see [the table](#power-loss)",
    ],
)
def test_the_words_of_the_project_pass(text: str) -> None:
    assert not diary_words(text), text


def test_a_planted_diary_word_fails_the_scans(tmp_path: Path) -> None:
    """Both scans can fail: a document and a module that cite an issue are reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "topic.md").write_text("# Topic\n\nAs issue 36 asks, this.\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text('"""A module.\n\nSee #12."""\n\n# at this stop\n')
    assert scan_documents(tmp_path) == ["docs/topic.md:3: issue 36"]
    assert scan_code(tmp_path, "pkg") == ["pkg/mod.py:1: #12", "pkg/mod.py:5: this stop"]


def test_no_diary_words_in_the_documents() -> None:
    found = scan_documents(ROOT)
    assert not found, "issue numbers or stops in the documents:\n" + "\n".join(found)


def test_no_diary_words_in_docstrings_or_comments() -> None:
    found = scan_code(ROOT, *CODE)
    assert not found, "issue numbers or stops in docstrings or comments:\n" + "\n".join(found)
