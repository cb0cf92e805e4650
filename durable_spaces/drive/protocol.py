"""The driver <-> coordinator contract, defined once: exit codes, the ``CUA_SESSION_*``
environment (built by the coordinator, parsed strictly by the driver), and the lines a
driver prints (``CUA-HEARTBEAT <epoch> <unix_ms>``, ``DS-EVENT <json>``).

Exit codes: 0 done, 78 permanent (nothing a retry can fix: a bad environment, a
``PermanentFailure``, a submission that ended unanswered), 75 fenced (a newer epoch
exists: ignore this process), anything else crashed (resume with backoff).

The environment: ``CUA_SESSION_NAME``, ``CUA_SESSION_EPOCH`` (1..2**63-1, ASCII digits),
``CUA_SESSION_STATE_DIR`` (absolute; the fenced log lives there),
``CUA_SESSION_HEARTBEAT_SECS``, optional ``CUA_SESSION_SPACE`` (the Space the coordinator
placed).

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

import json
import math
import os
import re
import stat
import threading
import time
import unicodedata
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from durable_spaces.errors import ConfigError
from durable_spaces.harness.log import MAX_EPOCH

EXIT_DONE = 0
EXIT_CRASHED = 1
EXIT_FENCED = 75
EXIT_PERMANENT = 78

NAME = "CUA_SESSION_NAME"
EPOCH = "CUA_SESSION_EPOCH"
STATE_DIR = "CUA_SESSION_STATE_DIR"
HEARTBEAT_SECS = "CUA_SESSION_HEARTBEAT_SECS"
SPACE = "CUA_SESSION_SPACE"
DEFAULT_HEARTBEAT_SECS = "30"

HEARTBEAT_PREFIX = "CUA-HEARTBEAT "
EVENT_PREFIX = "DS-EVENT "
_MARKERS = re.compile(r"(?=CUA-HEARTBEAT |DS-EVENT )")
_DECODER = json.JSONDecoder()

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


def driver_environment(
    name: str,
    epoch: int,
    state_dir: str | os.PathLike[str],
    heartbeat_secs: float,
    space: str | None = None,
) -> dict[str, str]:
    """The ``CUA_SESSION_*`` variables a coordinator gives a driver."""
    env = {
        NAME: name,
        EPOCH: str(epoch),
        STATE_DIR: str(state_dir),
        HEARTBEAT_SECS: f"{heartbeat_secs:g}",
    }
    if space:
        env[SPACE] = space
    return env


def heartbeat_line(epoch: int, unix_ms: int | None = None) -> str:
    return f"{HEARTBEAT_PREFIX}{epoch} {int(time.time() * 1000) if unix_ms is None else unix_ms}\n"


def event_line(event: str, **fields: Any) -> str:
    data = {"event": event, "unix_ms": int(time.time() * 1000), **fields}
    return f"{EVENT_PREFIX}{json.dumps(data)}\n"


def read_line(line: str) -> Iterator[tuple[str, Mapping[str, Any] | None]]:
    """What a line of a driver's stdout says: ``("heartbeat", None)`` and ``("event",
    data)`` items. Two threads printing without a lock can glue a heartbeat and an event
    into one line: it is split on the markers, and only an event's leading JSON value is
    read (anything else on the line is ignored)."""
    for part in _MARKERS.split(line):
        if part.startswith(HEARTBEAT_PREFIX):
            yield "heartbeat", None
        elif part.startswith(EVENT_PREFIX):
            try:
                data, _ = _DECODER.raw_decode(part[len(EVENT_PREFIX) :].strip())
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict):
                yield "event", data
