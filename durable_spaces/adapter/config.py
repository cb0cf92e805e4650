"""The adapter's configuration: one frozen value, made once, copied per session.

Everything that used to be set on the adapter after it was built (the driver's epoch,
the session's namespace, the log's fence and the callbacks the driver chains) is a
field here, and ``with_session`` makes the driver's copy: a session never mutates the
adapter a user built, and the adapter a call runs in never changes under it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from durable_spaces.adapter.checkpoints.snapshots import Snapshots
from durable_spaces.adapter.image import ImageLimits
from durable_spaces.adapter.recovery import RecoveryListener
from durable_spaces.drive.protocol import EPOCH, parse_epoch
from durable_spaces.errors import ConfigError, StaleEpochError
from durable_spaces.harness.log import Fence, check_epoch
from durable_spaces.settings import DEFAULTS, Settings
from durable_spaces.space import SpaceBackend

Mode = Literal["auto", "transactional", "checkpoint"]
MODES: tuple[Mode, ...] = ("auto", "transactional", "checkpoint")

StaleCallback = Callable[[StaleEpochError], None]
CallCallback = Callable[[str, str], None]


def session_epoch(epoch: int | None) -> int:
    """The adapter's epoch: the one given (an int 1..2**63-1), else ``CUA_SESSION_EPOCH``
    parsed as strictly as the driver does (``ConfigError`` naming it)."""
    if epoch is not None:
        if check_epoch(epoch) < 1:
            raise ConfigError(f"epoch must be >= 1, not {epoch}")
        return epoch
    return parse_epoch(EPOCH, os.environ.get(EPOCH, "1"))


@dataclass(frozen=True)
class AdapterConfig:
    """What ``durable_spaces(...)`` was asked for, plus the session it runs in.

    ``namespace``: Space names derive from ``<namespace>/<conversation id>`` (conversation
    ids are unique within one log, Space names must be unique on the backend).
    ``on_call`` is told (tool, call id) as each wrapped call starts (the driver's first
    step); ``on_stale`` when a Space or the log refuses this epoch."""

    spaces: SpaceBackend
    snapshots: Snapshots
    cwd: str | None = None
    mode: Mode = "auto"
    epoch: int = 1
    limits: ImageLimits = field(default_factory=ImageLimits)
    namespace: str | None = None
    name_for: Callable[[str], str] | None = None
    fence: Fence | None = None
    on_stale: StaleCallback | None = None
    on_recovery: RecoveryListener | None = None
    on_call: CallCallback | None = None
    #: The product's ``DS_*`` settings (``durable_spaces/settings.py``), read once where
    #: the adapter was built; the driver's log and the checkpoint engine take theirs here.
    settings: Settings = DEFAULTS

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode must be auto, transactional or checkpoint, not {self.mode!r}")
        check_epoch(self.epoch)

    def with_session(
        self,
        *,
        epoch: int,
        namespace: str,
        fence: Fence,
        on_stale: StaleCallback,
        on_recovery: RecoveryListener | None,
        on_call: CallCallback | None,
    ) -> AdapterConfig:
        """The driver's copy: this attempt's epoch and fence; the user's namespace and
        callbacks win where given (a namespace set by the user is kept)."""
        return replace(
            self,
            epoch=epoch,
            namespace=self.namespace if self.namespace is not None else namespace,
            fence=fence,
            on_stale=on_stale,
            on_recovery=on_recovery,
            on_call=on_call,
        )
