"""A file read from outside, within bounds: its type, its size and the depth of what it
holds.

Run records, recipes, schedules, traces, state files, checkpoint manifests and the
checker's inputs are read from files a user named or a record points at. Each read them
its own way, and three things went through: a FIFO in their place hung the open for
good (a plain ``open`` waits for a writer), ``/dev/zero`` or a huge file was read
whole, and a record nested 100000 deep raised ``RecursionError`` out of ``json.loads``
(a traceback instead of one line, and one bad record ended a whole report).

So every such read goes through here:

- **type**: the path is looked at first (``stat``, or ``lstat`` with ``follow=False``),
  then opened ``O_NONBLOCK`` and checked again on the descriptor (``fstat``): anything
  but a regular file (a FIFO, a socket, a device, a directory) is refused in one line,
  and the open itself never waits (a FIFO opened ``O_NONBLOCK`` for reading returns at
  once; a swap between the look and the open is caught by the second check).
- **size**: at most ``max_bytes`` are read; a file with more is refused, not cut.
- **depth**: Python's own parsers do the parsing (``json``, ``tomllib``); a document
  nested deeper than they can go (``RecursionError``) or deeper than ``max_depth``
  (measured without recursion) is refused, so the code that walks the value later never
  meets a depth it cannot walk either.

Every refusal is ``BadFileError`` (a ``ValueError``) naming the file; a missing file is
the ``OSError`` it always was (callers tell "absent" from "bad"). Nothing is written.
Imports only ``errors.py`` and ``host/files.py``, like the rest of ``host/``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_spaces.errors import BadFileError
from durable_spaces.host.files import kind_words

#: A state file of one value (an id, a number, a token, a path): a few hundred bytes.
MAX_VALUE_BYTES = 4096
#: A state file of one small JSON object (a daemon's, a machine's, a coordinator's).
MAX_STATE_BYTES = 1 << 20

#: How deep a document read from a file may nest. Ours nest a few levels (a run record's
#: schedule is the deepest, at six); Python's parsers give up near a thousand.
MAX_DEPTH = 64


def _not_a_file(path: str | os.PathLike[str], mode: int) -> BadFileError:
    return BadFileError(f"{os.fspath(path)} is {kind_words(mode)}, not a regular file")


def open_file(path: str | os.PathLike[str], *, follow: bool = True) -> int:
    """A descriptor of the regular file ``path``, opened for reading without ever
    waiting (module doc); the caller closes it. ``follow=False``: a symlink at ``path``
    is refused rather than followed."""
    st = os.stat(path, follow_symlinks=follow)
    if not stat.S_ISREG(st.st_mode):
        raise _not_a_file(path, st.st_mode)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:  # swapped for a symlink since the look
            raise _not_a_file(path, stat.S_IFLNK) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # swapped between the look and the open
        os.close(fd)
        raise _not_a_file(path, mode)
    return fd


def read_bytes(path: str | os.PathLike[str], *, max_bytes: int, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them (module doc)."""
    fd = open_file(path, follow=follow)
    try:
        if os.fstat(fd).st_size > max_bytes:
            raise BadFileError(f"{os.fspath(path)} is over {max_bytes} bytes")
        chunks: list[bytes] = []
        left = max_bytes + 1  # one more: a file that grew since fstat is caught
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise BadFileError(f"{os.fspath(path)} is over {max_bytes} bytes")
    return data


def read_text(
    path: str | os.PathLike[str], *, max_bytes: int, follow: bool = True, errors: str = "strict"
) -> str:
    """``read_bytes`` decoded as UTF-8 (``BadFileError`` when it is not, unless ``errors``
    says how to replace)."""
    data = read_bytes(path, max_bytes=max_bytes, follow=follow)
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise BadFileError(f"{os.fspath(path)} is not UTF-8 text ({e.reason})") from None


def depth(value: Any, limit: int | None = None) -> int:
    """How deep ``value`` nests (a scalar 0, ``[]`` 1, ``[[1]]`` 2), measured without
    recursion; stops as soon as it passes ``limit`` (then returns ``limit + 1``)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list | tuple):
            children = v
        else:
            continue
        deepest = max(deepest, d)
        if limit is not None and deepest > limit:
            return deepest
        stack.extend((c, d + 1) for c in children if isinstance(c, dict | list | tuple))
    return deepest


def _bounded(parse: Callable[[], Any], where: str, max_depth: int | None, kind: str) -> Any:
    try:
        value = parse()
    except RecursionError:
        deeper = "than its parser can go" if max_depth is None else f"than {max_depth}"
        raise BadFileError(f"{where}: {kind} nested deeper {deeper}") from None
    if max_depth is not None and depth(value, max_depth) > max_depth:
        raise BadFileError(f"{where}: {kind} nested deeper than {max_depth}")
    return value


def parse_json(
    data: str | bytes, *, where: str, max_depth: int | None = MAX_DEPTH, **options: Any
) -> Any:
    """``json.loads(data, **options)`` with its depth bounded; ``BadFileError`` naming
    ``where`` when it is not JSON (UTF-8 errors included) or nests too deep.
    ``max_depth=None``: only as deep as the parser goes (no walk of the value after: a
    log's commits, read by the thousand, whose values the reader never recurses into)."""

    def parse() -> Any:
        try:
            return json.loads(data, **options)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise BadFileError(f"{where}: not JSON ({str(e)[:160]})") from None

    return _bounded(parse, where, max_depth, "JSON")


def load_json(
    path: str | os.PathLike[str],
    *,
    max_bytes: int,
    max_depth: int = MAX_DEPTH,
    follow: bool = True,
    **options: Any,
) -> Any:
    """The JSON document of the regular file ``path``, bounded (module doc)."""
    data = read_bytes(path, max_bytes=max_bytes, follow=follow)
    return parse_json(data, where=os.fspath(path), max_depth=max_depth, **options)


def load_object(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_STATE_BYTES, follow: bool = True
) -> dict[str, Any]:
    """``load_json`` of a file that must hold a JSON object (``BadFileError`` if not)."""
    value = load_json(path, max_bytes=max_bytes, follow=follow)
    if not isinstance(value, dict):
        raise BadFileError(f"{os.fspath(path)}: not a JSON object")
    return value


def parse_toml(text: str, *, where: str, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """``tomllib.loads(text)`` with its depth bounded (``BadFileError`` naming ``where``)."""

    def parse() -> dict[str, Any]:
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise BadFileError(f"{where}: not TOML ({e})") from None

    out: dict[str, Any] = _bounded(parse, where, max_depth, "TOML")
    return out


def load_toml(
    path: str | os.PathLike[str], *, max_bytes: int, max_depth: int = MAX_DEPTH, follow: bool = True
) -> dict[str, Any]:
    """The TOML document of the regular file ``path``, bounded (module doc)."""
    text = read_text(path, max_bytes=max_bytes, follow=follow)
    return parse_toml(text, where=os.fspath(Path(path)), max_depth=max_depth)


__all__ = [
    "MAX_DEPTH",
    "MAX_STATE_BYTES",
    "MAX_VALUE_BYTES",
    "depth",
    "load_json",
    "load_object",
    "load_toml",
    "open_file",
    "parse_json",
    "parse_toml",
    "read_bytes",
    "read_text",
]
