"""The one reader of files from outside (``durable_spaces/host/bounded.py``): a FIFO, a
device, a directory or (when asked) a symlink is refused in one line without waiting; a
file over its bound is refused without being read whole; a JSON or TOML document nested
deeper than its bound, or than Python's parsers go, is refused as ``BadFileError``, never
a ``RecursionError``."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from bad_files import ABYSS, deep_json, deep_toml, fifo, on_a_fifo, sparse

from durable_spaces.errors import BadFileError
from durable_spaces.host import bounded
from durable_spaces.host.bounded import (
    MAX_DEPTH,
    depth,
    load_json,
    load_object,
    load_toml,
    parse_json,
    read_bytes,
    read_text,
)


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    f = tmp_path / "f.json"
    f.write_bytes(b'{"a": [1, {"b": 2}]}')
    assert read_bytes(f, max_bytes=100) == f.read_bytes()
    assert load_json(f, max_bytes=100) == {"a": [1, {"b": 2}]}
    assert load_object(f) == {"a": [1, {"b": 2}]}


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    f = fifo(tmp_path / "record.json")
    for read in (
        lambda: read_bytes(f, max_bytes=100),
        lambda: load_json(f, max_bytes=100),
        lambda: load_toml(f, max_bytes=100),
        lambda: read_text(f, max_bytes=100, follow=False),
    ):
        got = on_a_fifo(f, read)
        assert not got.waited
        assert isinstance(got.error, BadFileError), got
        assert str(got.error) == f"{f} is a FIFO, not a regular file"


def test_a_fifo_swapped_in_after_the_look_is_refused_on_its_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look at the path sees a regular file, which is then swapped for a FIFO before
    the open: opened O_NONBLOCK it does not wait, and fstat refuses it."""
    f = tmp_path / "state.json"
    f.write_text("{}")
    real = os.stat

    def look_then_swap(path: Any, *args: Any, **kw: Any) -> os.stat_result:
        st = real(path, *args, **kw)
        if Path(path) == f and stat.S_ISREG(st.st_mode):
            f.unlink()
            os.mkfifo(f)
        return st

    monkeypatch.setattr(bounded.os, "stat", look_then_swap)
    got = on_a_fifo(f, lambda: read_bytes(f, max_bytes=100))
    assert not got.waited
    assert isinstance(got.error, BadFileError) and "is a FIFO" in str(got.error), got


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("/dev/zero", "a character device"),
        ("/dev/null", "a character device"),
        (".", "a directory"),
    ],
)
def test_a_device_or_a_directory_is_refused_unread(path: str, what: str) -> None:
    with pytest.raises(BadFileError, match=f"is {what}, not a regular file"):
        read_bytes(path, max_bytes=1 << 20)


def test_a_symlink_is_refused_when_it_must_not_be_followed(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert load_json(tmp_path / "link.json", max_bytes=10) == {}
    with pytest.raises(BadFileError, match="is a symbolic link"):
        load_json(tmp_path / "link.json", max_bytes=10, follow=False)


def test_a_file_over_its_bound_is_refused_not_cut(tmp_path: Path) -> None:
    f = sparse(tmp_path / "big.json", (1 << 30) + 1)  # a reader that read it whole reads 1 GiB
    with pytest.raises(BadFileError, match=f"{f} is over 1024 bytes"):
        read_bytes(f, max_bytes=1024)
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 1024)
    assert len(read_bytes(exact, max_bytes=1024)) == 1024


def test_a_missing_file_is_the_oserror_it_always_was(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "nope", max_bytes=10)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 900, ABYSS])
def test_json_nested_too_deep_is_refused_in_one_line(levels: int, tmp_path: Path) -> None:
    f = tmp_path / "deep.json"
    f.write_bytes(deep_json(levels))
    with pytest.raises(BadFileError, match=f"^{f}: JSON nested deeper than {MAX_DEPTH}$"):
        load_json(f, max_bytes=1 << 20)


def test_json_at_its_bound_is_read() -> None:
    value = parse_json(deep_json(MAX_DEPTH), where="x")
    assert depth(value) == MAX_DEPTH


def test_no_bound_but_the_parser_s_own_still_refuses_what_it_cannot_parse() -> None:
    assert depth(parse_json(deep_json(500), where="a log", max_depth=None)) == 500
    with pytest.raises(BadFileError, match="a log: JSON nested deeper than its parser can go"):
        parse_json(deep_json(), where="a log", max_depth=None)


@pytest.mark.parametrize("levels", [MAX_DEPTH, ABYSS])
def test_toml_nested_too_deep_is_refused_in_one_line(levels: int, tmp_path: Path) -> None:
    """A TOML's value under a key is one deeper than its brackets (the table holds it)."""
    f = tmp_path / "recipe.toml"
    f.write_bytes(deep_toml(levels))
    with pytest.raises(BadFileError, match=f"^{f}: TOML nested deeper than {MAX_DEPTH}$"):
        load_toml(f, max_bytes=1 << 20)


def test_bad_text_and_bad_json_name_the_file(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"\xff{")
    with pytest.raises(BadFileError, match=f"^{f} is not UTF-8 text"):
        read_text(f, max_bytes=10)
    with pytest.raises(BadFileError, match=f"^{f}: not JSON"):
        load_json(f, max_bytes=10)
    f.write_text("[1]")
    with pytest.raises(BadFileError, match=f"^{f}: not a JSON object$"):
        load_object(f)


def test_depth_is_measured_without_recursion() -> None:
    assert [depth(v) for v in (1, "s", [], {}, [[1]], {"a": [{}]}, ([],))] == [0, 0, 1, 1, 2, 3, 2]
    chain: list[object] = []
    node = chain
    for _ in range(ABYSS):  # a value no recursive walk could measure
        node.append([])
        node = node[0]  # type: ignore[assignment]
    assert depth(chain) == ABYSS + 1
    assert depth(chain, limit=10) == 11  # it stops once past the limit
