"""``DurableWorkspace``: the adapter's bash, write and edit for a framework's own tools.

What a framework integration (``langgraph.py``, ``openai_agents.py``, ``pydantic_ai.py``)
hands its tools: ``run(call)`` from async code, ``run_sync(call)`` from a worker thread
(LangGraph runs sync tools in a pool). Everything it does happens on an event loop of
its own, in a thread of its own, started at the first call: the adapter, its Spaces and
its log belong to one loop, and a framework may call from several (DBOS's, the user's,
LangGraph's pool threads). Nothing is opened before the first call, so a program may
build it at import time (DBOS registers its workflows then).

The state directory holds what speaks for the adapter: the log (``log.sqlite``), its
lock, the ``local`` backend's Spaces (``spaces/``), the checkpoint store
(``checkpoints/``). It must not be inside the workspace: a command in the Space could
rewrite it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from durable_spaces.adapter.checkpoints.snapshots import WorkspaceSnapshots
from durable_spaces.adapter.checkpoints.store import DirectoryCheckpointStore
from durable_spaces.adapter.config import MODES, Mode
from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
from durable_spaces.adapter.recovery import RecoveryListener
from durable_spaces.backends import known_backends, open_backend
from durable_spaces.errors import ConfigError
from durable_spaces.harness.tools import ToolResult
from durable_spaces.host.files import make_dir_durable
from durable_spaces.integrations.attempt import PINNED, WorkspaceAttempt
from durable_spaces.integrations.threads import FrameworkCall, Threads
from durable_spaces.space import SpaceBackend, space_name

__all__ = ["DurableWorkspace"]

T = TypeVar("T")
#: How long ``close`` waits for the loop's work to end (a call in flight is left to the
#: next attempt's recovery, as a crash would leave it).
CLOSE_WAIT_S = 30.0


class DurableWorkspace:
    """Where a framework's durable tools act: one Space per thread (or one directory of
    this machine, ``workspace=``), kept by the adapter in ``mode`` with its log under
    ``state_dir``; ``backend`` a backend's name (its Spaces under ``state_dir/spaces``)
    or a ``SpaceBackend``; ``on_recovery`` told every recovery decision."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        workspace: str | os.PathLike[str] | None = None,
        backend: str | SpaceBackend = "local",
        mode: Mode = "auto",
        exclude: Sequence[str] = (),
        on_recovery: RecoveryListener | None = None,
    ) -> None:
        self.state_dir = Path(state_dir).absolute()
        if mode not in MODES:
            raise ConfigError(f"mode must be auto, transactional or checkpoint, not {mode!r}")
        if isinstance(backend, str) and backend not in known_backends():
            raise ConfigError(f"no backend {backend!r} (known: {', '.join(known_backends())})")
        self.pinned = None if workspace is None else _pinned(workspace, backend, self.state_dir)
        self.mode = mode
        self._backend = backend
        self._exclude = tuple(exclude)
        self._on_recovery = on_recovery
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._opening: asyncio.Task[tuple[WorkspaceAttempt, Threads]] | None = None

    # --- the calls ----------------------------------------------------------------------------

    async def run(self, call: FrameworkCall) -> ToolResult:
        """The call's result, from any event loop."""
        return await asyncio.wrap_future(self._submit(self._run(call)))

    def run_sync(self, call: FrameworkCall) -> ToolResult:
        """The call's result, from a thread with no event loop of this workspace's."""
        return self._submit(self._run(call)).result()

    async def _run(self, call: FrameworkCall) -> ToolResult:
        attempt, threads = await self._opened()
        if attempt.stale is not None:
            raise attempt.stale  # a newer attempt owns the log: nothing more from this one
        return await threads.run(call)

    @property
    def epoch(self) -> int | None:
        """This process's epoch, once its first call opened the log."""
        task = self._opening
        if task is None or not task.done() or task.cancelled() or task.exception():
            return None
        return task.result()[0].epoch

    # --- opening ------------------------------------------------------------------------------

    async def _opened(self) -> tuple[WorkspaceAttempt, Threads]:
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        return await asyncio.shield(self._opening)

    async def _open(self) -> tuple[WorkspaceAttempt, Threads]:
        pinned = self.pinned
        attempt = await WorkspaceAttempt.open(
            self.state_dir, self._adapter(), self._on_recovery, pinned
        )
        log = attempt.harness.log_id

        def space_of(thread: str) -> str:
            # named by the log too: two state directories on one backend never share one
            return PINNED if pinned is not None else space_name(f"thread/{thread}/{log}")

        return attempt, Threads(attempt.harness, attempt.durable, space_of, bool(pinned))

    def _adapter(self) -> DurableSpaces:
        for made in ("spaces", "checkpoints"):  # durable before anything is kept in them
            make_dir_durable(self.state_dir / made)
        if isinstance(self._backend, str):
            spaces = open_backend(self._backend, self.state_dir / "spaces")
        else:
            spaces = self._backend
        store = DirectoryCheckpointStore(self.state_dir / "checkpoints")
        return durable_spaces(
            spaces,
            snapshots=WorkspaceSnapshots(spaces, store=store),
            mode=self.mode,
            epoch=1,  # each attempt's own is taken from the log (attempt.py)
            exclude=self._exclude,
        )

    # --- the loop -------------------------------------------------------------------------------

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="durable-workspace", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
                atexit.register(self.close)
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def close(self) -> None:
        """Let go of the log and the Spaces' connections (the Spaces go on). A call in
        flight is left to the next attempt, as a crash would leave it."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        atexit.unregister(self.close)

        async def shut() -> None:
            task = self._opening
            if task is not None and task.done() and not task.cancelled() and not task.exception():
                await task.result()[0].close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), loop).result(CLOSE_WAIT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CLOSE_WAIT_S)
        self._opening = None


def _pinned(workspace: str | os.PathLike[str], backend: object, state_dir: Path) -> Path:
    """The directory a pinned workspace names, checked: local backend, an existing
    directory, the state directory not in it."""
    if backend != "local":
        raise ConfigError(
            "workspace= names a directory of this machine: only the local backend's Space "
            "can be one (other backends keep a Space per thread)"
        )
    path = Path(workspace).absolute()
    if not path.is_dir():
        raise ConfigError(f"workspace {path} is not a directory")
    real, state = path.resolve(), state_dir.resolve()
    if state == real or real in state.parents:
        raise ConfigError(
            f"the state directory {state_dir} is inside the workspace {path}: a command "
            "could rewrite the log; put it outside"
        )
    return path
