"""The product's settings: every ``DS_*`` variable the product takes, read once, frozen.

``Settings.from_env()`` is the one place the product reads its ``DS_*`` variables
(``tests/unit/test_configuration_edge.py`` holds every other module to that). It is
called at the edges: a command's start (``cli/app.py``), a backend or an adapter built
without settings given (their constructors), the driver's entry (``drive/entry.py``
takes the adapter's). Everything below them receives the value, a parameter or a field,
and never looks at the environment again: a switch cannot change under a running call,
and a test or a bench passes ``Settings(space_journal=False)`` instead of setting a
variable for the whole process. The lab's own variables are ``campaigns/spec.py``'s.

Why strict: the switches used to be read each its own way, and most took anything but
``0`` as on, so ``off``, ``false`` or a typo silently left the feature on, the opposite
of what whoever set it meant. A switch is ``0`` or ``1`` (spaces around allowed), a
number is checked against its range, a path must be one; anything else is a
``ConfigError`` of one line naming the variable, raised when the settings are made.

``docs/configuration.md`` lists every variable, its type, default and meaning.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Self

from durable_spaces.errors import ConfigError

#: Largest time a setting takes (a day): beyond it a typo, not a plan.
MAX_SECONDS = 86400.0


def parse_switch(name: str, raw: str) -> bool:
    """``1`` on, ``0`` off (spaces around allowed); anything else ``ConfigError``."""
    value = raw.strip()
    if value not in ("0", "1"):
        raise ConfigError(f"{name}={raw!r}: 0 (off) or 1 (on)")
    return value == "1"


def _seconds(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_SECONDS:  # NaN fails too
        raise ConfigError(f"{name}={raw!r}: seconds, more than 0 and at most {MAX_SECONDS:g}")
    return value


def _count(lo: int, hi: int) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        value = raw.strip()
        if not re.fullmatch(r"[0-9]{1,9}", value, re.ASCII) or not lo <= int(value) <= hi:
            raise ConfigError(f"{name}={raw!r}: a whole number from {lo} to {hi}")
        return int(value)

    return parse


def _path(name: str, raw: str) -> Path:
    if not raw.strip() or "\0" in raw or len(raw) > 4096:
        raise ConfigError(f"{name}={raw[:80]!r}: not a path")
    return Path(raw).expanduser()


def _url(name: str, raw: str) -> str:
    if not re.fullmatch(r"https?://[^\s'\"\\]{1,2000}", raw, re.ASCII):
        raise ConfigError(f"{name}={raw[:80]!r}: an http(s) URL")
    return raw


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        if raw not in choices:
            raise ConfigError(f"{name}={raw!r}: {' or '.join(choices)}")
        return raw

    return parse


def _upper_choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        if raw.strip().upper() not in choices:
            raise ConfigError(f"{name}={raw!r}: {' or '.join(choices)}")
        return raw.strip().upper()

    return parse


def setting(
    env: str,
    default: Any,
    parse: Callable[[str, str], Any],
    *,
    recorded: bool = True,
    doc: str = "",
) -> Any:
    """A field read from ``env`` by ``parse(name, raw)``. ``recorded``: it chooses the code
    a run takes, so run records carry it and a replay sets it again; machine-local
    places (caches, binaries) are not recorded (another machine has its own)."""
    return field(
        default=default,
        metadata={"env": env, "parse": parse, "recorded": recorded, "doc": doc},
    )


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class EnvFields:
    """Frozen settings whose fields are ``setting(...)``: made from an environment, and
    written back as one (``to_env``). ``campaigns/spec.py``'s ``LabSettings`` is one too."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **given: Any) -> Self:
        """From ``env`` (the process's by default): unset means the default (and so does
        empty, for a setting whose default is none); ``given`` fields win. ``ConfigError``
        of one line for the first bad value (an empty switch is one)."""
        e = os.environ if env is None else env
        kw: dict[str, Any] = {}
        for f in fields(cls):
            raw = e.get(f.metadata["env"])
            if raw is None or (raw == "" and f.default is None):
                continue
            kw[f.name] = f.metadata["parse"](f.metadata["env"], raw)
        kw.update(given)
        return cls(**kw)

    @classmethod
    def names(cls, *, recorded_only: bool = False) -> tuple[str, ...]:
        """The variables, in field order (``recorded_only``: those a run record keeps)."""
        return tuple(
            f.metadata["env"] for f in fields(cls) if f.metadata["recorded"] or not recorded_only
        )

    def to_env(self, *, recorded_only: bool = False) -> dict[str, str]:
        """Every variable with its value (defaults included; None left out): the whole
        configuration, as a child process or a replay takes it back."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (f.metadata["recorded"] or not recorded_only):
                out[f.metadata["env"]] = _text(value)
        return out

    def with_(self, **changes: Any) -> Self:
        return replace(self, **changes)


@dataclass(frozen=True)
class Settings(EnvFields):
    """What the product takes from ``DS_*`` variables (``docs/configuration.md``)."""

    # -- speed mechanisms, on unless switched off (to compare: ``bench/``) --
    space_journal: bool = setting(
        "DS_SPACE_JOURNAL", True, parse_switch,
        doc="keep a Space's workspace listing by an inotify change journal; 0: scan in full",
    )  # fmt: skip
    host_scan: bool = setting(
        "DS_HOST_SCAN", True, parse_switch,
        doc="scan a daemon's Space whose workspace this host sees here; 0: through the "
        "daemon (its journal in the Space, as a microvm's)",
    )  # fmt: skip
    local_forkserver: bool = setting(
        "DS_LOCAL_FORKSERVER", True, parse_switch,
        doc="local Spaces start commands through a fork server per Space",
    )  # fmt: skip
    local_forkserver_idle: float = setting(
        "DS_LOCAL_FORKSERVER_IDLE", 30.0, _seconds, recorded=False,
        doc="seconds a local fork server waits for requests before it exits",
    )  # fmt: skip
    local_forkserver_failpoints: str | None = setting(
        "DS_LOCAL_FORKSERVER_FAILPOINTS", None, lambda name, raw: raw, recorded=False,
        doc="failpoints armed in a local fork server itself (its DS_FAILPOINTS), for tests",
    )  # fmt: skip
    warm_drivers: bool = setting(
        "DS_WARM_DRIVERS", True, parse_switch,
        doc="a coordinator keeps a driver started before its epoch (drive/spares.py)",
    )  # fmt: skip
    zygote_socket: Path | None = setting(
        "DS_ZYGOTE_SOCKET", None, _path, recorded=False,
        doc="the campaign's zygote (drive/zygote.py) that forks spare drivers: set by the "
        "lab for its processes, not by hand",
    )  # fmt: skip
    inode_pool: bool = setting(
        "DS_INODE_POOL", True, parse_switch,
        doc="a checkpoint batch's files are made ahead (O_TMPFILE)",
    )  # fmt: skip
    copy_behind: bool = setting(
        "DS_COPY_BEHIND", True, parse_switch,
        doc="a checkpoint's Space copy is written after the call's result commits",
    )  # fmt: skip
    # -- the driver's log --
    log_format: str = setting(
        "DS_LOG_FORMAT", "sqlite", _choice("sqlite", "jsonl"),
        doc="the driver's log: log.sqlite, or log.jsonl with its marker-file fence",
    )  # fmt: skip
    log_synchronous: str = setting(
        "DS_LOG_SYNCHRONOUS", "NORMAL", _upper_choice("NORMAL", "FULL", "OFF"),
        doc="the log's durability: NORMAL or FULL (SQLite's level); OFF (JSONL only): no fsync",
    )  # fmt: skip
    # -- whose Space, and what a take-back keeps --
    space_adopt: str = setting(
        "DS_SPACE_ADOPT", "refuse", _choice("refuse", "as-is", "log"),
        doc="a Space another log owns: refuse it (nothing changed), take it as it is, or "
        "take it back to this log (adapter/space_owner.py)",
    )  # fmt: skip
    quarantine_days: int = setting(
        "DS_QUARANTINE_DAYS", 30, _count(1, 36500),
        doc="days a quarantine checkpoint (what a revert or restore would have deleted that "
        "nothing else held) is kept at least (adapter/quarantine.py)",
    )  # fmt: skip
    # -- the host --
    host_boot_id: Path | None = setting(
        "DS_HOST_BOOT_ID", None, _path, recorded=False,
        doc="a file to read this host's boot id from instead of the kernel's (the lab's "
        "power losses)",
    )  # fmt: skip
    pg_bindir: Path | None = setting(
        "DS_PG_BINDIR", None, _path, recorded=False,
        doc="where initdb and pg_ctl are (a private PostgreSQL); else the newest installed",
    )  # fmt: skip
    # -- the images --
    cache_dir: Path = setting(
        "DS_CACHE_DIR", Path("~/.cache/durable-spaces").expanduser(), _path, recorded=False,
        doc="where the guest root filesystem's debootstrap tarball is cached",
    )  # fmt: skip
    debian_mirror: str = setting(
        "DS_DEBIAN_MIRROR", "http://deb.debian.org/debian", _url, recorded=False,
        doc="the Debian mirror the guest root filesystem is bootstrapped from",
    )  # fmt: skip
    # -- the microvm backend --
    microvm_accel: str | None = setting(
        "DS_MICROVM_ACCEL", None, _choice("tcg", "kvm"),
        doc="force QEMU's accelerator; unset: KVM when a real boot works, else TCG",
    )  # fmt: skip
    microvm_cache: Path | None = setting(
        "DS_MICROVM_CACHE", None, _path, recorded=False,
        doc="where microvm images are built and found (default "
        "~/.cache/durable-spaces-microvm of the user's real home)",
    )  # fmt: skip
    microvm_kernel_deb: Path | None = setting(
        "DS_MICROVM_KERNEL_DEB", None, _path, recorded=False,
        doc="the guest kernel's .deb; unset: apt's cache, the image cache, or apt-get download",
    )  # fmt: skip
    microvm_memory_mb: int = setting(
        "DS_MICROVM_MEMORY_MB", 512, _count(64, 65536),
        doc="guest memory of the microvm image's base checkpoint (make microvm-image)",
    )  # fmt: skip
    microvm_compress: bool = setting(
        "DS_MICROVM_COMPRESS", True, parse_switch,
        doc="zstd a machine checkpoint's memory files",
    )  # fmt: skip
    microvm_keep_checkpoints: int = setting(
        "DS_MICROVM_KEEP_CHECKPOINTS", 0, _count(0, 1_000_000),
        doc="keep only this many newest checkpoints per Space (0: all until pruned)",
    )  # fmt: skip
    microvm_sweep_orphans: bool = setting(
        "DS_MICROVM_SWEEP_ORPHANS", False, parse_switch,
        doc="kill processes the guest's daemon does not track when the epoch rises",
    )  # fmt: skip
    microvm_boot_timeout: float = setting(
        "DS_MICROVM_BOOT_TIMEOUT", 120.0, _seconds, recorded=False,
        doc="seconds a guest's boot may take to reach its daemon",
    )  # fmt: skip
    microvm_restore_timeout: float = setting(
        "DS_MICROVM_RESTORE_TIMEOUT", 60.0, _seconds, recorded=False,
        doc="seconds a guest's restore from a checkpoint may take",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.log_synchronous == "OFF" and self.log_format != "jsonl":
            raise ConfigError(
                f"DS_LOG_SYNCHRONOUS=OFF is for a JSONL log (DS_LOG_FORMAT=jsonl), "
                f"not {self.log_format}: NORMAL or FULL"
            )


#: The defaults, for a part made without settings (a test's, a helper's).
DEFAULTS = Settings()


def of(given: Settings | None, *owners: object) -> Settings:
    """``given``, else the first ``owners``' ``settings`` (the backend a part works
    with: one reading for both), else read from the environment now (a public part
    built without settings is an edge)."""
    if given is not None:
        return given
    for owner in owners:
        found = getattr(owner, "settings", None)
        if isinstance(found, Settings):
            return found
    return Settings.from_env()


__all__ = ["DEFAULTS", "MAX_SECONDS", "EnvFields", "Settings", "of", "parse_switch", "setting"]
