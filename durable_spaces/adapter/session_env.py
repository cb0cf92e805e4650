"""The driver's environment (``CUA_SESSION_*``), parsed strictly.

A coordinator writes these values, but a wrong one must end the driver with exit 78 and
one line naming the variable: retrying cannot fix an environment, and a traceback (exit
1) would be retried with backoff up to the attempt cap. Strict means stricter than
Python's parsers: ``int()`` takes ``" 5 "``, ``"1_0"`` and a fullwidth ``"\\uff15"``,
``float()`` takes ``"inf"`` and ``"nan"``. So numbers are ASCII digits in a range the
parts downstream can hold (an epoch is stored in SQLite's int64, a heartbeat is a
``threading`` timeout), names have no control characters and a bounded length, and the
state directory is an absolute path to a writable directory (or one that can be made in
an existing one): the driver never creates anything outside it.
"""

from __future__ import annotations

import math
import os
import re
import stat
import threading
import unicodedata
from pathlib import Path

from durable_spaces.errors import ConfigError
from durable_spaces.harness.log import MAX_EPOCH

MAX_NAME_CHARS = 256
#: Below this a heartbeat thread would spin, printing thousands of lines a second.
MIN_HEARTBEAT_S = 0.01
MAX_HEARTBEAT_S = threading.TIMEOUT_MAX
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
#: What every backend accepts as a Space name (the local backend's rule, the strictest).
_SPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)


def _shown(raw: str, limit: int = 60) -> str:
    text = repr(raw)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(raw)} chars)"


def parse_epoch(var: str, raw: str) -> int:
    """An epoch: ASCII digits, 1..2**63-1 (the SQLite fence stores it as an INTEGER)."""
    if raw.startswith("-") and _DIGITS.fullmatch(raw[1:]):
        raise ConfigError(f"{var} must be >= 1, got {_shown(raw)}")
    if not _DIGITS.fullmatch(raw):
        raise ConfigError(f"{var} must be a decimal integer of ASCII digits, got {_shown(raw)}")
    digits = raw.lstrip("0")
    if len(digits) > len(str(MAX_EPOCH)) or int(digits or "0") > MAX_EPOCH:
        raise ConfigError(f"{var} must be at most 2**63-1 (SQLite's INTEGER), got {_shown(raw)}")
    value = int(digits or "0")
    if value < 1:
        raise ConfigError(f"{var} must be >= 1, got {_shown(raw)}")
    return value


def parse_seconds(var: str, raw: str, *, lo: float, hi: float) -> float:
    """A finite decimal number of seconds in ``lo..hi`` (no inf, nan, sign or spaces)."""
    if not _DECIMAL.fullmatch(raw):
        raise ConfigError(f"{var} must be a plain decimal number of seconds, got {_shown(raw)}")
    value = float(raw)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise ConfigError(f"{var} must be between {lo:g} and {hi:g} seconds, got {_shown(raw)}")
    return value


def parse_name(var: str, raw: str, *, max_chars: int = MAX_NAME_CHARS) -> str:
    """A name for messages, request ids and Space namespaces: 1..max_chars characters,
    no control or format characters, no surrounding whitespace."""
    if not raw.strip():
        raise ConfigError(f"{var} is not set")
    if len(raw) > max_chars:
        raise ConfigError(f"{var} is {len(raw)} characters long; at most {max_chars} allowed")
    bad = next((c for c in raw if unicodedata.category(c).startswith("C")), None)
    if bad is not None:
        raise ConfigError(f"{var} holds a control character ({bad!r}): {_shown(raw)}")
    if raw != raw.strip():
        raise ConfigError(f"{var} has leading or trailing whitespace: {_shown(raw)}")
    return raw


def parse_space(var: str, raw: str) -> str:
    """A Space name every backend accepts."""
    if not _SPACE.fullmatch(raw):
        raise ConfigError(
            f"{var} must be a Space name ([A-Za-z0-9][A-Za-z0-9._-]*, at most 128 characters), "
            f"got {_shown(raw)}"
        )
    return raw


def check_state_dir(var: str, raw: str) -> Path:
    """An absolute path to a writable directory, or to a missing one whose parent exists
    and is writable (the driver makes only that last component). A symlink to a directory
    is the operator's choice and accepted; a dangling one is refused."""
    if not raw.strip():
        raise ConfigError(f"{var} is not set")
    if "\x00" in raw:
        raise ConfigError(f"{var} holds a NUL byte: {_shown(raw)}")
    path = Path(raw)
    if not path.is_absolute():
        raise ConfigError(f"{var} must be an absolute path, got {_shown(raw)}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = path.parent
        if not parent.is_dir():
            raise ConfigError(
                f"{var}={_shown(raw)} does not exist and neither does its parent {parent}"
            ) from None
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(
                f"{var}={_shown(raw)} does not exist and its parent {parent} is not writable"
            ) from None
        return path
    except OSError as e:
        raise ConfigError(f"{var}={_shown(raw)} cannot be used: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(path)
        except OSError:
            raise ConfigError(f"{var}={_shown(raw)} is a dangling symbolic link") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{var}={_shown(raw)} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{var}={_shown(raw)} is not writable")
    return path


def make_state_dir(var: str, path: Path) -> None:
    """Create the (checked) state directory if it is missing: 0700, its last component
    only, so nothing is made outside it."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"{var}={_shown(str(path))} cannot be created: {e.strerror or e}"
        ) from None
    if not path.is_dir():
        raise ConfigError(f"{var}={_shown(str(path))} is not a directory")
