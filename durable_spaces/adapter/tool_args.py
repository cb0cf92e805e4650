"""The wrapped tools' arguments, checked before anything happens.

A model (or a log written by an older build, or a hostile one) can hand a tool anything:
a missing ``path``, a number for ``content``, ``None`` for ``command``, a string with a
lone surrogate that UTF-8 cannot encode, a NUL that no exec can carry, a ``timeout`` of
``inf``. Taking those as ``""`` or ``None`` used to run the wrong call, or crash it after
its start mark. Here each wrapped call's arguments become a small typed value or a
``ToolArgumentError`` the model sees as the tool's error, before the Space or the log is
touched. Unknown keys are ignored (models add them); known ones must have their type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from durable_spaces.errors import ToolArgumentError

#: A ``timeout`` beyond this is refused (a day: longer than any stall bound is useful).
MAX_TIMEOUT_S = 24 * 3600.0
#: What one write may carry (the transactional image's own limit is 16 MiB in all).
MAX_CONTENT_BYTES = 64 * 1024 * 1024
#: Path bounds the Space's filesystems impose anyway (NAME_MAX, PATH_MAX), refused
#: early and clearly instead of as an OSError half-way through a call.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
#: A call's key (``ToolContext.call_key``: ids the model or a framework chose) goes into
#: a command's environment as ``DS_CALL_KEY``: bounded, and nothing an exec cannot carry.
MAX_CALL_KEY_BYTES = 1024


@dataclass(frozen=True)
class BashArgs:
    command: str
    timeout: float | None = None


@dataclass(frozen=True)
class WriteArgs:
    path: str
    content: str


@dataclass(frozen=True)
class EditArgs:
    path: str
    old_text: str
    new_text: str


ToolArgs = BashArgs | WriteArgs | EditArgs


def _text(args: Mapping[str, Any], key: str, *, empty: bool = True) -> str:
    if key not in args:
        raise ToolArgumentError(f"missing argument {key!r}")
    value = args[key]
    if not isinstance(value, str):
        raise ToolArgumentError(f"argument {key!r} must be a string, not {type(value).__name__}")
    if not empty and not value:
        raise ToolArgumentError(f"argument {key!r} must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ToolArgumentError(f"argument {key!r} is not valid text ({e.reason})") from None
    return value


def _path(args: Mapping[str, Any]) -> str:
    path = _text(args, "path", empty=False)
    if "\x00" in path:
        raise ToolArgumentError("argument 'path' contains a NUL byte")
    raw = path.encode()
    if len(raw) > MAX_PATH_BYTES:
        raise ToolArgumentError(f"argument 'path' is {len(raw)} bytes, over {MAX_PATH_BYTES}")
    for part in path.split("/"):
        if len(part.encode()) > MAX_NAME_BYTES:
            raise ToolArgumentError(
                f"a name in 'path' is {len(part.encode())} bytes, over {MAX_NAME_BYTES}"
            )
    return path


def _timeout(args: Mapping[str, Any]) -> float | None:
    value = args.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolArgumentError(
            f"argument 'timeout' must be a number of seconds, not {type(value).__name__}"
        )
    t = float(value)
    if not math.isfinite(t) or t <= 0 or t > MAX_TIMEOUT_S:
        raise ToolArgumentError(
            f"argument 'timeout' must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], not {value}"
        )
    return t


def parse(tool: str, args: Any) -> ToolArgs:
    """The checked arguments of a wrapped ``tool`` call (``ToolArgumentError`` otherwise)."""
    if not isinstance(args, Mapping):
        raise ToolArgumentError(f"{tool}: arguments must be an object, not {type(args).__name__}")
    if tool == "bash":
        command = _text(args, "command", empty=False)
        if "\x00" in command:
            raise ToolArgumentError("argument 'command' contains a NUL byte")
        return BashArgs(command, _timeout(args))
    if tool == "write":
        content = _text(args, "content")
        if len(content.encode()) > MAX_CONTENT_BYTES:
            raise ToolArgumentError(f"argument 'content' is over {MAX_CONTENT_BYTES} bytes")
        return WriteArgs(_path(args), content)
    if tool == "edit":
        return EditArgs(_path(args), _text(args, "old_text", empty=False), _text(args, "new_text"))
    raise ToolArgumentError(f"no such wrapped tool {tool!r}")


def check_call_key(key: str) -> None:
    """A call's key that a command's environment can carry (``ToolArgumentError``)."""
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise ToolArgumentError("the call's id is not valid text (a lone surrogate)") from None
    if "\x00" in key or size > MAX_CALL_KEY_BYTES:
        raise ToolArgumentError(
            f"the call's id cannot be a key: a NUL byte, or over {MAX_CALL_KEY_BYTES} bytes"
        )
