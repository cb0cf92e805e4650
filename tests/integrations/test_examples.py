"""Each framework's page's example (docs/integrations-<framework>.md) run in this
environment, twice: the task done once (examples.py). The same examples run in clean
virtual environments in ``test_clean_install.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from examples import FRAMEWORKS, check_example, example, run_example
from needs import need


def test_each_page_has_its_example() -> None:
    for framework in FRAMEWORKS:
        assert "durable_spaces.integrations" in example(framework)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_example_does_its_task_once(tmp_path: Path, framework: str) -> None:
    need("probe-harnesses")
    check_example(run_example(sys.executable, framework, tmp_path), tmp_path)
