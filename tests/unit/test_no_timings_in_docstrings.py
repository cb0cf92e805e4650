"""No measured timings in the package's docstrings and comments.

A figure such as "11 ms of 15, measured here" goes stale unseen: nobody re-measures a
comment. The reason and the invariant stay in the code; the figure goes to
docs/performance.md with the command that measured it and its date.

The rule is narrow on purpose: a duration (a number with a time unit) in the same
sentence as a word that says it was measured or what it costs ("measured", "took",
"costs", "saves", "faster", ...), a duration "of" a larger whole ("11 ms of 15", "0.6 ms
of a call"), or a speed-up ("3x faster"). A duration that is part of the contract (a
default timeout, a heartbeat's period, a bound) says none of that and passes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doc_texts import code_texts

import durable_spaces

PACKAGE = Path(durable_spaces.__file__).parent

_NUMBER = r"~?\d+(?:[.,]\d+)?(?:\s*-\s*\d+(?:[.,]\d+)?)?"
_UNIT = r"(?:ms|µs|us|ns|s|secs?|seconds?|milliseconds?|microseconds?|minutes?)"
DURATION = re.compile(rf"(?<![\w.]){_NUMBER}\s*{_UNIT}(?![\w])")
MEASURE = re.compile(
    r"\b(?:measured|measuring|took|takes|spent|spends|costs?|costing|saves?|saved|saving"
    r"|paid|pays|faster|slower|speed-?ups?)\b",
    re.IGNORECASE,
)
PART_OF = re.compile(rf"(?<![\w.]){_NUMBER}\s*{_UNIT}\s+of\s+(?:a|an|the|each|every|its|~?\d)\b")
SPEEDUP = re.compile(
    r"(?<![\w.])~?\d+(?:\.\d+)?\s*(?:x|\u00d7|times)\s+(?:faster|slower|cheaper|quicker)\b",
    re.IGNORECASE,
)


def figures(text: str) -> list[str]:
    """The sentences of ``text`` (a docstring or a comment block) that state a timing."""
    flat = " ".join(text.split())
    found = []
    for sentence in re.split(r"(?<=[.;!?])\s+(?=\S)", flat):
        if (
            (DURATION.search(sentence) and MEASURE.search(sentence))
            or PART_OF.search(sentence)
            or SPEEDUP.search(sentence)
        ):
            found.append(sentence)
    return found


def scan(root: Path) -> list[str]:
    """``file:line: sentence`` for every timing in the docstrings and comments under
    ``root`` (Python modules, and the Perl and shell scripts shipped with them)."""
    return [
        f"{path.relative_to(root)}:{line}: {sentence}"
        for path, line, text in code_texts(root)
        for sentence in figures(text)
    ]


@pytest.mark.parametrize(
    "text",
    [
        "the rendering was most of a checkpoint's look (11 ms of 15 with 16 of them, measured"
        " here).",
        "Why: a scan took ~250 ms under TCG.",
        "the hand-off cost more than the work: ~0.3 ms idle, 1-2 loaded",
        "an inode made while the journal commits\nwaits about 230 us per file here, and costs it",
        "one command fewer per call: 250 ms of a microvm call under TCG",
        "sharing only immutable leaves: ~3x faster than copy.deepcopy",
        "The pool saves 1.3 ms a checkpoint.",
    ],
)
def test_a_timing_is_found(text: str) -> None:
    assert figures(text), text


@pytest.mark.parametrize(
    "text",
    [
        "BOOT_TIMEOUT: a cold boot must answer within 120 s, or the Space is unavailable.",
        "The server's heartbeat: the time it last wrote, every 0.2 s.",
        "hosts beat every 0.5 s and count as lost after 3 s: a loaded machine must not lose"
        " a healthy one.",
        "A week: a run that needs longer is wedged (the default is 900 s).",
        "Report live output (kept and committed at most every ~200 ms).",
        "Its tail of 64 KiB is replayed; the image's own limit is 16 MiB.",
        "Taking a checkpoint costs a walk of what changed.",
    ],
)
def test_a_contract_figure_passes(text: str) -> None:
    assert not figures(text), text


def test_a_planted_timing_fails_the_scan(tmp_path: Path) -> None:
    """The check can fail: a module with a measured figure in a docstring, one in a
    comment and one in a Perl script's comment is reported three times; a clean one is
    not."""
    (tmp_path / "room").mkdir()
    (tmp_path / "room" / "planted.py").write_text(
        '"""A part.\n\nWhy: the walk took ~4 ms at 1000 files here."""\n\n'
        "TIMEOUT_S = 120.0  # a bound, not a figure\n\n"
        "# the fork server saves\n# about 10 ms a spawn\n"
        "x = 1\n"
    )
    (tmp_path / "room" / "helper.pl").write_text("#!/usr/bin/perl\n# POSIX costs ~230 ms\n")
    (tmp_path / "clean.py").write_text('"""Waits at most 20 s for the pause point."""\n')
    found = scan(tmp_path)
    assert [f.split(":")[0:2] for f in found] == [
        ["room/helper.pl", "2"],
        ["room/planted.py", "1"],
        ["room/planted.py", "7"],
    ], found


def test_no_timing_in_the_package_docstrings_or_comments() -> None:
    found = scan(PACKAGE)
    assert not found, (
        "timings in docstrings or comments (move each figure to docs/performance.md with the"
        " command that measured it and its date; keep the reason):\n" + "\n".join(found)
    )
