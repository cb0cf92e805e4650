"""What the two ways of keeping a Space (``transactional.py``, ``checkpointing.py``)
and the call pipeline (``calls.py``) share: the configuration, the open Spaces, the
machine watch, the log's witness, the quarantine, the one way to commit the
``cua.space`` document, and recovery events. Built once per adapter by ``durable.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from durable_spaces.adapter import image_log
from durable_spaces.adapter import space_state as state_doc
from durable_spaces.adapter.config import AdapterConfig
from durable_spaces.adapter.log_witness import LogWitness
from durable_spaces.adapter.machine import BootWatch
from durable_spaces.adapter.quarantine import Quarantine
from durable_spaces.adapter.recovery import RecoveryEvent, RecoveryKind
from durable_spaces.adapter.space_state import CallRecord, SpaceState
from durable_spaces.adapter.spaces import SpaceKeeper

if TYPE_CHECKING:
    from durable_spaces.adapter.image_log import ImageUpdate
    from durable_spaces.harness.handles import HarnessView


@dataclass
class Parts:
    config: AdapterConfig
    spaces: SpaceKeeper
    boot: BootWatch
    witness: LogWitness
    quarantine: Quarantine
    events: list[RecoveryEvent] = field(default_factory=list)

    @staticmethod
    def of(config: AdapterConfig) -> Parts:
        spaces = SpaceKeeper(config)
        days = config.settings.quarantine_days
        quarantine = Quarantine(config.snapshots, days, spaces.epoch_for)
        return Parts(config, spaces, BootWatch(spaces), LogWitness(), quarantine)

    def epoch_for(self, name: str) -> int:
        return self.spaces.epoch_for(name)

    async def commit(
        self, harness: HarnessView, conv: str, state: SpaceState, image: ImageUpdate | None = None
    ) -> None:
        """Commit the document (stamped with the machine's boot id this driver is bound
        to), with the image's new version when given."""
        self.boot.stamp(state)
        await state_doc.commit(harness, conv, state, image)
        if image is not None:
            image_log.remember(harness, conv, image)  # the next read needs no replay

    def emit(
        self,
        kind: RecoveryKind,
        conv: str,
        rec: CallRecord | None,
        mode: str | None = None,
        **detail: Any,
    ) -> None:
        """Record a recovery decision; every event says the mode it was decided in."""
        mode = mode or (rec.mode if rec is not None else self.config.mode)
        ev = RecoveryEvent(kind, mode, rec.call_id if rec else None, conv, detail)
        self.events.append(ev)
        if self.config.on_recovery is not None:
            self.config.on_recovery(ev)
