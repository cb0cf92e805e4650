"""Backend ``local``: a Space that is a directory on this machine, with no daemon.

A stand-in for cua-spacesd that keeps the same contract with files and detached
processes, for tests and for machines without the real daemon. Layout of a Space::

    <state_dir>/<name>/
        instance       uuid written at create (Space.instance_id)
        work/          the workspace (Space.root)
        ledger.jsonl   one line per key, fsynced before the command is spawned (``ledger``)
        epoch          the floor, replaced atomically under ``lock`` (flock)
        lock
        staging/       temporaries of file writes (renamed into work/, never left there)
        cmds/<id>/     meta.json (supervisor pid + create time, epoch), output, status
        forkserver.*   the Space's fork server: sock, json (pid, create time, version), log

The Space (``local_space``) runs each command under ``supervisor.py`` in its own session and
process group, forked by the Space's fork server (``forkserver.py``) or started
directly. The supervisor does not depend on its caller: a SIGKILLed driver leaves it
running, and the next driver reattaches by key (``execution``).

The "machine" is the Space's process tree (``procs``): every command carries
``DS_SPACE=<instance>`` (and ``DS_EPOCH``) in its environment, and restart/delete kill
every recorded process group plus every process whose environment carries the mark.
Where the host allows, every command is also born in a cgroup v2 of its Space and epoch
(``cgroups.py``; ``<state_dir>/.cgroup-parent`` says where), which an advance, a restart
and a delete kill whole: nothing a command starts escapes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from durable_spaces.backends.local.cgroups import recorded_parent, sweep
from durable_spaces.backends.local.disk import write_atomic
from durable_spaces.backends.local.local_space import LocalSpace
from durable_spaces.backends.local.lock import MACHINE_PATIENCE_S
from durable_spaces.backends.local.procs import kill_space, reap, space_procs
from durable_spaces.errors import ConfigError, SpaceGoneError, SpaceUnavailableError
from durable_spaces.host.bounded import MAX_VALUE_BYTES, read_text
from durable_spaces.host.files import fsync_dir
from durable_spaces.settings import Settings

__all__ = ["LocalBackend", "LocalSpace", "unavailable_reason"]

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def unavailable_reason() -> str | None:
    """Why this backend cannot run here, or None (conformance-suite convention)."""
    if not sys.platform.startswith("linux"):
        return f"the local backend needs Linux (posix_spawn, O_NOFOLLOW walks), not {sys.platform}"
    return None


class LocalBackend:
    """Spaces as directories under ``state_dir``; see the module docstring."""

    kind = "local"

    def __init__(
        self,
        state_dir: str | Path,
        cgroup_root: str | Path | None = None,
        settings: Settings | None = None,
    ) -> None:
        """``cgroup_root``: where the Spaces' epoch cgroups go (``cgroups.py``); by
        default under this process's own cgroup v2, as the state dir recorded it.
        ``settings``: the product's (``durable_spaces/settings.py``), read from the
        environment now when not given."""
        self.settings = Settings.from_env() if settings is None else settings
        self.state_dir = Path(state_dir).resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._cgroup_root = None if cgroup_root is None else Path(cgroup_root)
        # The cgroups of Spaces gone with a crashed delete: killed and removed now.
        sweep(self.state_dir, recorded_parent(self.state_dir, self._cgroup_root))

    def _dir(self, name: str) -> Path:
        if not _NAME_RE.fullmatch(name):
            raise ConfigError(f"invalid Space name {name!r} (want [A-Za-z0-9][A-Za-z0-9._-]*)")
        return self.state_dir / name

    def _open(self, name: str) -> LocalSpace | None:
        d = self._dir(name)
        try:
            instance = read_text(d / "instance", max_bytes=MAX_VALUE_BYTES).strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return LocalSpace(name, d, instance, self._cgroup_root, self.settings)

    def _create_sync(self, name: str) -> LocalSpace:
        d = self._dir(name)
        for _ in range(3):
            found = self._open(name)
            if found is not None:
                return found
            tmp = self.state_dir / f".creating-{uuid.uuid4().hex}"
            (tmp / "work").mkdir(parents=True)
            (tmp / "cmds").mkdir()
            for fname, data in (
                ("epoch", b"0"),
                ("ledger.jsonl", b""),
                ("lock", b""),
                ("instance", uuid.uuid4().hex.encode()),
            ):
                write_atomic(tmp / fname, data)
            try:
                os.rename(tmp, d)
            except OSError:  # someone else created it first, or junk without an instance
                shutil.rmtree(tmp, ignore_errors=True)
                if d.exists() and not (d / "instance").exists():
                    os.rename(d, self.state_dir / f".junk-{uuid.uuid4().hex}")
                continue
            fsync_dir(self.state_dir)
        found = self._open(name)
        if found is None:
            raise SpaceUnavailableError(f"could not create Space {name} in {self.state_dir}")
        return found

    async def create(self, name: str) -> LocalSpace:
        return await asyncio.to_thread(self._create_sync, name)

    async def find(self, name: str) -> LocalSpace | None:
        return self._open(name)

    def _restart_sync(self, name: str) -> None:
        space = self._open(name)
        if space is None:
            raise SpaceGoneError(f"Space {name} does not exist")
        with space._locked(MACHINE_PATIENCE_S) as locked:
            space.cgroups.kill_below(None)
            kill_space(space._d, space.instance_id)
            # Unkeyed commands leave no record; a spawn frozen under the lock may be
            # writing into its own dir, so without the lock they stay (garbage).
            for cmd in (space._d / "cmds").glob("p-*") if locked else ():
                shutil.rmtree(cmd, ignore_errors=True)
            # A new boot: no change journal kept from before is trusted (``LocalSpace``).
            write_atomic(space._d / "boot", uuid.uuid4().hex.encode(), fsync=False)

    async def restart(self, name: str) -> None:
        await asyncio.to_thread(self._restart_sync, name)

    def _signal_sync(self, name: str, sig: int) -> None:
        space = self._open(name)
        if space is None:
            raise SpaceGoneError(f"Space {name} does not exist")
        procs = space_procs(space._d, space.instance_id)
        known = {p.pid for p in procs}
        for pid in space.cgroups.pids():  # those that left the group and the mark too
            if pid not in known:
                with contextlib.suppress(psutil.Error):
                    procs.append(psutil.Process(pid))
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    async def pause(self, name: str) -> None:
        """Freeze the Space's machine: every process of it is SIGSTOPped (the stand-in has
        no daemon: its file operations run in the caller and are not frozen)."""
        await asyncio.to_thread(self._signal_sync, name, signal.SIGSTOP)

    async def resume(self, name: str) -> None:
        with contextlib.suppress(SpaceGoneError):
            await asyncio.to_thread(self._signal_sync, name, signal.SIGCONT)

    async def kill_daemon(self, name: str) -> None:
        """The local stand-in's "daemon" is the Space's process tree, its fork server
        included, so this is ``restart``. Commands die with it (as with the namespaced
        spacesd) and running records read ``lost``. Killing the fork server alone would be
        a weaker fault: its commands' supervisors outlive it by design, so nothing but the
        next spawn's start of a new server would show."""
        await self.restart(name)

    def _delete_sync(self, name: str) -> None:
        space = self._open(name)
        d = self._dir(name)
        if space is not None:
            with space._locked(MACHINE_PATIENCE_S):
                space.cgroups.remove()
                kill_space(d, space.instance_id)
                tomb = self.state_dir / f".deleted-{uuid.uuid4().hex}"
                os.rename(d, tomb)
            shutil.rmtree(tomb, ignore_errors=True)
        elif d.exists():
            shutil.rmtree(d, ignore_errors=True)

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self._delete_sync, name)

    async def names(self) -> list[str]:
        return sorted(
            p.name
            for p in self.state_dir.iterdir()
            if not p.name.startswith(".") and (p / "instance").exists()
        )

    async def close(self) -> None:
        reap()


if TYPE_CHECKING:  # what mypy checks this backend against (durable_spaces.space)
    from durable_spaces.space import Faults, HostWorkspace, JournaledSpace, Space, SpaceBackend

    def _conforms(
        b: LocalBackend, s: LocalSpace
    ) -> tuple[SpaceBackend, Faults, Space, JournaledSpace, HostWorkspace]:
        return b, b, s, s, s
