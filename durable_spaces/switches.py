"""The on/off switches read from the environment, read one way.

Switches: ``DS_SPACE_JOURNAL``, ``DS_HOST_SCAN``, ``DS_LOCAL_FORKSERVER``, ``DS_WARM_DRIVERS``,
``DS_WARM_WORKERS``, ``DS_FAST_EXIT``, ``DS_INODE_POOL``, ``DS_COPY_BEHIND``,
``DS_ZYGOTE``.

Why: each of them used to be read its own way, and most took anything but ``0`` as
"on". A value such as ``off``, ``false`` or a typo then silently left the feature on,
which is the opposite of what whoever set it meant. Now any value but ``0`` or ``1`` is
a ``ConfigError`` that names the variable, raised where the switch is first needed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from durable_spaces.errors import ConfigError


def switch(name: str, env: Mapping[str, str] | None = None, default: bool = True) -> bool:
    """``name`` in ``env`` (the process's environment by default).

    Unset means ``default``, ``1`` means on, ``0`` means off, with spaces around the
    value allowed. Anything else raises ``ConfigError``."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None:
        return default
    value = raw.strip()
    if value not in ("0", "1"):
        raise ConfigError(f"{name}={raw!r}: 0 (off) or 1 (on)")
    return value == "1"


#: Every switch, so a command can check them all before it starts any work.
NAMES = (
    "DS_SPACE_JOURNAL",
    "DS_HOST_SCAN",
    "DS_LOCAL_FORKSERVER",
    "DS_WARM_DRIVERS",
    "DS_WARM_WORKERS",
    "DS_FAST_EXIT",
    "DS_INODE_POOL",
    "DS_COPY_BEHIND",
    "DS_ZYGOTE",
)


def check_all(env: Mapping[str, str] | None = None) -> None:
    """Raise ``ConfigError`` for the first malformed switch in ``env``."""
    for name in NAMES:
        switch(name, env)
