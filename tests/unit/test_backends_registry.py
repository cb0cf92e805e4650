"""The backend registry: names to modules imported on use, and the skip convention."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_spaces import backends
from durable_spaces.errors import ConfigError


def test_unknown_backend_lists_the_known_ones(state_dir: Path) -> None:
    with pytest.raises(ConfigError, match="local, spacesd, docker, microvm"):
        backends.open_backend("nosuch", state_dir)
    assert backends.unavailable_reason("local") is None


def test_missing_module_reads_not_written_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backends.BACKENDS, "future", "durable_spaces.backends.future:Future")
    reason = backends.unavailable_reason("future")
    assert reason is not None and "not written yet" in reason


def test_a_broken_import_inside_a_backend_is_not_hidden(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "ds_broken_backend.py").write_text("import ds_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(backends.BACKENDS, "broken", "ds_broken_backend:B")
    with pytest.raises(ModuleNotFoundError, match="ds_no_such_dependency"):
        backends.unavailable_reason("broken")


def test_backend_gets_state_dir_and_options(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "ds_echo_backend.py").write_text(
        "class B:\n"
        "    kind = 'echo'\n"
        "    def __init__(self, state_dir, **options):\n"
        "        self.args = (state_dir, options)\n"
        "def unavailable_reason():\n"
        "    return 'no echo here'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(backends.BACKENDS, "echo", "ds_echo_backend:B")
    b = backends.open_backend("echo", tmp_path, x=1)
    assert b.args == (tmp_path, {"x": 1})  # type: ignore[attr-defined]
    assert backends.unavailable_reason("echo") == "no echo here"
