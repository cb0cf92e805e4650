"""durable-spaces: keep an agent's sandbox (a Space) consistent with its durable log
across crashes, and the chaos lab that proves it.

The public API is the names below (``__all__``); everything else lives in internal
modules whose layout ``ARCHITECTURE.md`` maps. Names are imported on first use (PEP 562)
so that ``import durable_spaces`` costs nothing a driver does not need: a driver's start
is on the resume path of every crash.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # the adapter
    "durable_spaces": "durable_spaces.adapter.durable",
    "DurableSpaces": "durable_spaces.adapter.durable",
    "AdapterConfig": "durable_spaces.adapter.config",
    "ImageLimits": "durable_spaces.adapter.image",
    "WorkspaceSnapshots": "durable_spaces.adapter.checkpoints.snapshots",
    "SandboxSnapshots": "durable_spaces.adapter.checkpoints.snapshots",
    "DirectoryCheckpointStore": "durable_spaces.adapter.checkpoints.store",
    "CheckpointStore": "durable_spaces.adapter.checkpoints.store",
    "RecoveryEvent": "durable_spaces.adapter.recovery",
    "run_durable_session": "durable_spaces.drive.entry",
    "StartContext": "durable_spaces.drive.entry",
    "SessionHandle": "durable_spaces.drive.entry",
    "workspace_at": "durable_spaces.adapter.review",
    "diff_entries": "durable_spaces.adapter.review",
    "fork_at": "durable_spaces.adapter.review",
    "quarantines": "durable_spaces.adapter.review",
    "quarantined": "durable_spaces.adapter.review",
    # the harness and its log
    "Harness": "durable_spaces.harness.scheduler",
    "AgentConfig": "durable_spaces.harness.state",
    "Conversation": "durable_spaces.harness.handles",
    "Submission": "durable_spaces.harness.handles",
    "Registry": "durable_spaces.harness.tools",
    "CodingTools": "durable_spaces.harness.tools",
    "Tool": "durable_spaces.harness.tools",
    "ToolResult": "durable_spaces.harness.tools",
    "Extension": "durable_spaces.harness.tools",
    "open_fenced_sqlite": "durable_spaces.harness.log",
    "open_fenced_jsonl": "durable_spaces.harness.log",
    "open_storage": "durable_spaces.harness.log",
    # Spaces
    "Space": "durable_spaces.space",
    "SpaceBackend": "durable_spaces.space",
    "open_backend": "durable_spaces.backends",
    "known_backends": "durable_spaces.backends",
    # the DS_* settings (docs/configuration.md)
    "Settings": "durable_spaces.settings",
    # errors
    "DurableSpacesError": "durable_spaces.errors",
    "StaleEpochError": "durable_spaces.errors",
    "PermanentFailure": "durable_spaces.errors",
    "HaltError": "durable_spaces.errors",
    "ConfigError": "durable_spaces.errors",
    "SpaceOwnedError": "durable_spaces.errors",
}

__all__ = [
    "AdapterConfig",
    "AgentConfig",
    "CheckpointStore",
    "CodingTools",
    "ConfigError",
    "Conversation",
    "DirectoryCheckpointStore",
    "DurableSpaces",
    "DurableSpacesError",
    "Extension",
    "HaltError",
    "Harness",
    "ImageLimits",
    "PermanentFailure",
    "RecoveryEvent",
    "Registry",
    "SandboxSnapshots",
    "SessionHandle",
    "Settings",
    "Space",
    "SpaceBackend",
    "SpaceOwnedError",
    "StaleEpochError",
    "StartContext",
    "Submission",
    "Tool",
    "ToolResult",
    "WorkspaceSnapshots",
    "diff_entries",
    "durable_spaces",
    "fork_at",
    "known_backends",
    "open_backend",
    "open_fenced_jsonl",
    "open_fenced_sqlite",
    "open_storage",
    "quarantined",
    "quarantines",
    "run_durable_session",
    "workspace_at",
]
assert sorted(_EXPORTS) == __all__  # one list, kept in step


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'durable_spaces' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and IDEs see
    from durable_spaces.adapter.checkpoints.snapshots import SandboxSnapshots, WorkspaceSnapshots
    from durable_spaces.adapter.checkpoints.store import CheckpointStore, DirectoryCheckpointStore
    from durable_spaces.adapter.config import AdapterConfig
    from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
    from durable_spaces.adapter.image import ImageLimits
    from durable_spaces.adapter.recovery import RecoveryEvent
    from durable_spaces.adapter.review import (
        diff_entries,
        fork_at,
        quarantined,
        quarantines,
        workspace_at,
    )
    from durable_spaces.backends import known_backends, open_backend
    from durable_spaces.drive.entry import SessionHandle, StartContext, run_durable_session
    from durable_spaces.errors import (
        ConfigError,
        DurableSpacesError,
        HaltError,
        PermanentFailure,
        SpaceOwnedError,
        StaleEpochError,
    )
    from durable_spaces.harness.handles import Conversation, Submission
    from durable_spaces.harness.log import open_fenced_jsonl, open_fenced_sqlite, open_storage
    from durable_spaces.harness.scheduler import Harness
    from durable_spaces.harness.state import AgentConfig
    from durable_spaces.harness.tools import CodingTools, Extension, Registry, Tool, ToolResult
    from durable_spaces.settings import Settings
    from durable_spaces.space import Space, SpaceBackend
