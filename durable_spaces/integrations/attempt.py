"""One process's attempt at a framework's work: its epoch, its log, its adapter.

A framework's program is its own coordinator: each start of it (a launch, or the run
again after a crash that the framework resumes) is one attempt, as each driver process
of ``drive/entry.py`` is. An attempt takes the next epoch of the workspace's log (one
more than the log's floor, raised at once, under a lock every opener of the state
directory takes: no two attempts share an epoch, and an older one still running is
fenced out of the log from then on, and out of each Space at its first use by this one:
``adapter/spaces.py`` raises the Space's floor, which kills the older attempt's
commands). It opens the log (SQLite, ``synchronous=FULL``: see below), the adapter's
copy for this epoch and a ``Harness`` on the log that runs no model: the framework is
the harness; this one only keeps the log's conversations, documents and result entries
that the adapter keeps its knowledge in.

Every directory it makes is durable before it is used (``host.files.make_dir_durable``):
a directory whose entry a power cut takes takes the log with it, and the framework's
next call would run again in a workspace that already holds its effect.

Why ``FULL``: the framework commits a tool call's result after the adapter committed
its own (``threads.py``). A log that could lose its tail to a power cut while the
framework's kept its own would leave the framework knowing a call whose record and
image the log lost; the Space, found ahead of the log, would be taken back to it and the
call's effect undone under a framework that believes it happened. Every commit of this
log is on disk before the framework hears of the call.

The pinned workspace: with ``workspace=`` a directory (the ``local`` backend only), the
threads share one Space, ``workspace``, whose workspace is that directory (a symlink in
its place, as ``probe/recipes/durable-spaces/ds_agent.py`` places the probe's workdir).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from durable_spaces.adapter.durable import DurableSpaces
from durable_spaces.adapter.recovery import RecoveryListener
from durable_spaces.errors import ConfigError, StaleEpochError
from durable_spaces.harness.log import SqliteFence, SqliteStorage, check_epoch, open_fenced_sqlite
from durable_spaces.harness.scheduler import Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.host.files import fsync_dir, make_dir_durable
from durable_spaces.space import SpaceBackend

LOG_FILE = "log.sqlite"
LOCK_FILE = "attempt.lock"
#: The Space of a pinned workspace (``workspace=`` a directory).
PINNED = "workspace"


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    fd = os.open(
        state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def claim(state_dir: Path) -> tuple[SqliteStorage, SqliteFence]:
    """The log, fenced at the next epoch: one more than the floor it holds, raised now."""
    with _locked(state_dir):
        storage, fence = open_fenced_sqlite(state_dir / LOG_FILE, 1, synchronous="FULL")
        try:
            epoch = check_epoch(fence.floor() + 1)
            fence = SqliteFence(storage, epoch)
            storage.fence = fence
            fence.advance()
        except BaseException:
            storage.close()
            raise
    return storage, fence


def place_pinned(workdir: Path, root: str) -> None:
    """Make the pinned Space's workspace ``root`` the directory ``workdir`` (a symlink in
    place of the empty directory a new Space is made with); refuse one that is another
    directory's already."""
    work = Path(root)
    if work.is_symlink():
        if work.resolve() != workdir.resolve():
            raise ConfigError(
                f"the workspace's Space {work} is {work.resolve()}, not {workdir}: give this "
                "state directory its first workspace, or a new state directory"
            )
        return
    try:
        work.rmdir()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ConfigError(
            f"the Space at {work} already has a workspace of its own ({e.strerror}): "
            f"{workdir} cannot become it; use a new state directory"
        ) from None
    work.symlink_to(workdir.resolve(), target_is_directory=True)
    fsync_dir(work.parent)  # a power cut must not give the Space its empty directory back


@dataclass
class WorkspaceAttempt:
    """What one attempt holds open: close it last (``close``)."""

    epoch: int
    storage: SqliteStorage
    fence: SqliteFence
    harness: Harness
    durable: DurableSpaces
    stale: StaleEpochError | None = None

    @staticmethod
    async def open(
        state_dir: Path,
        durable: DurableSpaces,
        on_recovery: RecoveryListener | None,
        pinned: Path | None,
    ) -> WorkspaceAttempt:
        """Claim the next epoch and open everything at it; with ``pinned``, place the
        pinned Space's workspace (and raise its epoch) before anything else runs."""
        make_dir_durable(state_dir)
        storage, fence = claim(state_dir)
        try:
            holder: list[WorkspaceAttempt] = []

            def on_stale(err: StaleEpochError) -> None:
                if holder and holder[0].stale is None:
                    holder[0].stale = err

            session = durable.for_session(
                epoch=fence.epoch,
                log_id=storage.identity,  # before the harness opens: the pinned Space is judged
                namespace="",  # Spaces are bound by name (threads.py)
                fence=fence,
                on_stale=on_stale,
                on_recovery=on_recovery,
                on_call=None,
            )
            if pinned is not None:
                await place(session.spaces, pinned)
                await session.raise_epoch(PINNED)
            registry = Registry().install(CodingTools).install(session.extension)
            harness = await Harness.open(storage, models={}, registry=registry, env=session.env)
            fsync_dir(state_dir)  # what the backend and the store made in it: durable too
        except BaseException:
            storage.close()
            raise
        attempt = WorkspaceAttempt(fence.epoch, storage, fence, harness, session)
        holder.append(attempt)
        return attempt

    async def close(self) -> None:
        try:
            await self.harness.close()
            await self.durable.close()
        finally:
            self.storage.close()


async def place(spaces: SpaceBackend, workdir: Path) -> None:
    """The pinned Space, found or created, its workspace ``workdir``."""
    space = await spaces.find(PINNED) or await spaces.create(PINNED)
    place_pinned(workdir, space.root)
