"""Comments and docs cite only files that exist.

A moved module leaves its old path behind in docstrings, the Dockerfile and the Markdown
files; a reader who follows it finds nothing. Every repository path a text file names
(``durable_spaces/...py``, ``tests/...``, ``images/...``, ``bench/...``) must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(
    r"(?<![\w./-])((?:durable_spaces|tests|bench|images)/[\w/.-]+\.(?:py|sh|md|txt|toml))"
)
TEXTS = (
    "*.md",
    "Dockerfile",
    "Makefile",
    "durable_spaces/**/*.py",
    "tests/**/*.py",
    "bench/**/*.py",
    "images/**/*.sh",
    ".ci/*",
)


def cited_paths() -> list[tuple[str, int, str]]:
    found = []
    for pattern in TEXTS:
        for file in sorted(ROOT.glob(pattern)):
            if not file.is_file() or file == Path(__file__).resolve():
                continue
            for lineno, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
                for match in CITED.finditer(line):
                    found.append((str(file.relative_to(ROOT)), lineno, match.group(1)))
    return found


def test_the_scan_finds_citations() -> None:
    # the scan itself can fail: it sees the paths this repository does cite
    cited = {path for _, _, path in cited_paths()}
    assert "durable_spaces/harness/state.py" in cited


def test_every_cited_path_exists() -> None:
    missing = [f"{f}:{n}: {p}" for f, n, p in cited_paths() if not (ROOT / p).exists()]
    assert not missing, "cited files that do not exist:\n" + "\n".join(missing)
