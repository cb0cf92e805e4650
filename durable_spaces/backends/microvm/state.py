"""The host's record of each microvm Space: ``spaces/<name>/`` under the backend's state
directory (``state.json``, the token, QEMU's logs), the locks that serialize operations
on one Space, and the host's copy of its epoch floor.

Any process can find and kill a Space's machine from its state file (pid and start time,
so a reused pid is never taken for QEMU), and every operation that changes a Space holds
its lock, across processes (flock) and across tasks of one process (asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import re
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field

from durable_spaces.errors import SpaceError, SpaceGoneError, StaleEpochError
from durable_spaces.host.bounded import MAX_VALUE_BYTES, load_object, read_text
from durable_spaces.host.ports import free_port

#: Names of microvm Spaces: ``[a-z0-9-]``, at most 63 (a hostname, a file name).
NAME_OK = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


@dataclass
class MicrovmState:
    """What ``spaces/<name>/state.json`` holds."""

    instance_id: str
    port: int
    created: float
    chain: list[str] = field(default_factory=list)  # disk layers, bottom first; last = top
    pid: int = 0
    pid_start: float = 0.0
    boot: str = ""  # changes whenever the daemon (or the machine) is started anew
    booted: float = 0.0
    #: The checkpoint this machine was last restored or forked from (never pruned while
    #: this Space lives).
    restored_from: str = ""
    #: Token file of the checkpoint being restored while its token is still the one in
    #: guest memory (a driver killed before the rotation leaves it set: find() finishes).
    pending: str = ""
    #: The host's copy of the epoch floor. The guest's floor lives on its disk and rolls
    #: back with every restore; this one does not, so a stale restore or checkpoint is
    #: refused here, and a restored guest is raised to it before anyone else reaches it.
    floor: int = 0
    #: Frozen by ``pause`` (QMP stop) until ``resume``: a find() leaves it stopped.
    frozen: bool = False


class StateFiles:
    """The Spaces' records under ``state_dir`` (``spaces/`` and ``.locks/``)."""

    def __init__(self, state_dir: pathlib.Path) -> None:
        self.state_dir = state_dir
        for d in ("spaces", ".locks"):
            (state_dir / d).mkdir(parents=True, exist_ok=True)
        self._alocks: dict[tuple[int, str], asyncio.Lock] = {}

    def home(self, name: str) -> pathlib.Path:
        if not NAME_OK.match(name):
            raise ValueError(f"bad Space name {name!r}: [a-z0-9-], at most 63")
        return self.state_dir / "spaces" / name

    def qmp_sock(self, name: str) -> pathlib.Path:
        # unix socket paths are limited to 108 bytes: keep them short, unique per Space.
        h = hashlib.sha256(str(self.home(name)).encode()).hexdigest()[:16]
        return pathlib.Path("/tmp") / f"ds-qmp-{h}.sock"

    def read(self, name: str) -> MicrovmState | None:
        try:
            data = load_object(self.home(name) / "state.json")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except ValueError:  # torn (not JSON); a FIFO, too big, too deep are refused too
            return None
        try:
            return MicrovmState(**data)
        except TypeError as e:
            where = self.home(name) / "state.json"
            raise SpaceError(f"{where} is not a machine's state: {e}") from None

    def write(self, name: str, st: MicrovmState) -> None:
        path = self.home(name) / "state.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(asdict(st), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def token(self, name: str) -> str:
        return read_text(self.home(name) / "token", max_bytes=MAX_VALUE_BYTES).strip()

    def names(self) -> list[str]:
        return sorted(
            p.name
            for p in (self.state_dir / "spaces").iterdir()
            if NAME_OK.match(p.name) and (p / "state.json").exists()
        )

    def states(self) -> list[MicrovmState]:
        out = []
        for p in (self.state_dir / "spaces").iterdir():
            st = self.read(p.name) if NAME_OK.match(p.name) else None
            if st is not None:
                out.append(st)
        return out

    def init_space(self, name: str) -> MicrovmState:
        """A new Space's home with its own token, and its first state (not written yet)."""
        home = self.home(name)
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(home / "token", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))  # the same length as every token: fw_cfg size
        return MicrovmState(instance_id=secrets.token_hex(8), port=free_port(), created=time.time())

    def raise_floor(self, name: str, instance_id: str | None, epoch: int | None) -> MicrovmState:
        """The host floor check of a mutation by ``epoch`` (caller holds the Space's lock):
        refused below the floor, raised above it. ``epoch`` None is the backend's own
        operation (placement, faults), which is not fenced."""
        st = self.read(name)
        if st is None or (instance_id is not None and st.instance_id != instance_id):
            raise SpaceGoneError(f"no Space {name!r}")
        if epoch is not None:
            if epoch < st.floor:
                raise StaleEpochError(epoch, st.floor, f"Space {name}")
            if epoch > st.floor:
                st.floor = epoch
                self.write(name, st)
        return st

    @contextlib.asynccontextmanager
    async def lock(self, what: str) -> AsyncIterator[None]:
        """Serialize operations on one Space (or the disk pool) across processes and
        across tasks of this process.

        flock alone is not enough: two tasks of one event loop would each open the file
        and the second flock would block the loop's thread while the first holds it (a
        nemesis restarting a Space while the coordinator finds it deadlocked that way).
        So tasks queue on an asyncio lock first, and the flock is taken in a thread."""
        loop = asyncio.get_running_loop()
        key = (id(loop), what)
        alock = self._alocks.get(key)
        if alock is None:
            alock = self._alocks[key] = asyncio.Lock()
        async with alock:
            path = self.state_dir / ".locks" / f"{what}.lock"
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)
