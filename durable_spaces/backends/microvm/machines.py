"""The machines of microvm Spaces: starting one (a cold boot of its disk, or a restore of a
checkpoint's memory onto a fresh layer over its frozen disk), finishing one a killed
driver left half-way, forking, killing.

A Space's machine is QEMU on the top of its disk chain (``SpaceState.chain``: qcow2
layers in the backend's pool, bottom first). A restored or forked machine starts with the
token that was in the checkpoint's memory, so it is at once given the Space's own (the
daemon runs ``--await-token-file``), the host's clock (it resumes from the checkpoint's
instant) and host randomness (forks share random state; with no VM generation ID driver
in the cloud kernel the CRNG picks it up on its next reseed, not at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import secrets
import time
import uuid
from dataclasses import dataclass

from durable_spaces.backends.microvm import qemu
from durable_spaces.backends.microvm.microvm_space import TOKEN_PATH, MicrovmHost, MicrovmSpace
from durable_spaces.backends.microvm.state import MicrovmState
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import SpaceError, SpaceUnavailableError
from durable_spaces.host.bounded import MAX_VALUE_BYTES, read_text
from durable_spaces.host.ports import free_port

#: Gives a restored guest the host's clock, fresh randomness and (unless "same") a token.
_AFTER_RESTORE = (
    'date -s "@$1" >/dev/null; printf %s "$2" > /dev/urandom; '
    f'if [ "$3" != same ]; then umask 077; printf %s "$3" > {TOKEN_PATH}.new '
    f"&& mv {TOKEN_PATH}.new {TOKEN_PATH}; fi"
)


@dataclass(frozen=True)
class Source:
    """What a machine is restored from: memory, the frozen disk top, the token in memory."""

    memory: pathlib.Path
    chain: list[str]
    token_file: pathlib.Path

    @property
    def token(self) -> str:
        return read_text(self.token_file, max_bytes=MAX_VALUE_BYTES).strip()


class Machines:
    """The running machines of ``host``'s Spaces, and one Space object per instance."""

    def __init__(self, host: MicrovmHost, spec: qemu.VmSpec, last: dict[str, float]) -> None:
        self._host = host
        self.files = host.files
        self.spec = spec
        #: Figures of the last operations (seconds), shared with the backend.
        self.last = last
        self.spaces: dict[str, MicrovmSpace] = {}

    def new_layer(self, backing: str) -> str:
        """A new qcow2 layer in the pool over ``backing`` (caller holds the pool lock)."""
        path = self.files.state_dir / "disks" / f"{uuid.uuid4().hex}.qcow2"
        qemu.create_overlay(path, pathlib.Path(backing))
        return str(path)

    async def start(self, name: str, st: MicrovmState, source: Source | None) -> MicrovmState:
        """Start the Space's machine on ``st.chain``'s top: a restore of ``source`` (its
        memory; the top must be a fresh layer over ``source.chain``) or a cold boot.
        Caller holds the Space's lock; returns once the daemon answers with the Space's
        token, the guest clock set."""
        home = self.files.home(name)
        sock = self.files.qmp_sock(name)
        qemu.kill_strays(sock)
        for attempt in range(3):
            argv = qemu.qemu_argv(
                self.spec,
                disk=pathlib.Path(st.chain[-1]),
                port=st.port,
                token_file=home / "token",
                run_dir=home,
                qmp_sock=sock,
                incoming=source.memory if source else None,
            )
            t0 = time.monotonic()
            vm = qemu.launch(argv, home, sock)
            hit("microvm.start.spawned")  # a machine not recorded yet: kill_strays' case
            st.pid, st.pid_start = vm.pid, vm.start
            st.boot = secrets.token_hex(6)
            st.booted = time.time()
            st.pending = str(source.token_file) if source is not None else ""
            self.files.write(name, st)
            settings = self._host.settings
            timeout = settings.microvm_restore_timeout if source else settings.microvm_boot_timeout
            hit("microvm.start.launched")
            try:
                if source is not None:
                    self.last["load"] = await qemu.resume_incoming(sock, vm, timeout)
                await qemu.wait_health(st.port, timeout, vm, home)
                break
            except SpaceUnavailableError as e:
                qemu.kill(vm.pid, vm.start)
                taken = "hostfwd" in str(e) or "host forwarding" in str(e)
                if taken and attempt < 2:
                    st.port = free_port()  # the port was taken meanwhile
                    continue
                raise
        key = "restore" if source else "boot"
        self.last[key] = time.monotonic() - t0
        if source is not None:
            hit("microvm.start.resumed")
            self.spaces[name] = await self._after_restore(name, st, source.token)
            st.pending = ""
            self.files.write(name, st)
        self.last[key + "_ready"] = time.monotonic() - t0
        return st

    async def _after_restore(self, name: str, st: MicrovmState, old_token: str) -> MicrovmSpace:
        """Give the restored guest the Space's token, the host's clock and fresh randomness;
        returns the connected Space (its connection is reused)."""
        token = self.files.token(name)
        tmp = MicrovmSpace(self._host, name, st, old_token)
        rotate = token != old_token
        try:
            await tmp.root_run(
                _AFTER_RESTORE,
                f"{time.time():.6f}",
                secrets.token_hex(32),
                token if rotate else "same",
            )
        except SpaceUnavailableError:
            if not rotate:
                raise
        if not rotate:
            return tmp
        with contextlib.suppress(Exception):
            await tmp.close()
        # The daemon picks the file up on its own (inotify): wait until the new token works.
        sp = MicrovmSpace(self._host, name, st, token)
        deadline = time.monotonic() + 10
        while True:
            try:
                await sp._call("capabilities")
                return sp
            except SpaceUnavailableError:
                if time.monotonic() > deadline:
                    raise
                sp.disconnect()
                await asyncio.sleep(0.02)

    def space(self, name: str, st: MicrovmState) -> MicrovmSpace:
        """The Space object of ``st``'s instance and port (one per instance)."""
        sp = self.spaces.get(name)
        if sp is not None and sp.instance_id == st.instance_id and sp.port == st.port:
            return sp
        sp = MicrovmSpace(self._host, name, st, self.files.token(name))
        self.spaces[name] = sp
        return sp

    def drop(self, name: str) -> None:
        sp = self.spaces.pop(name, None)
        if sp is not None:
            sp.disconnect()

    def kill(self, name: str) -> None:
        st = self.files.read(name)
        if st is not None:
            qemu.kill(st.pid, st.pid_start)
        self.drop(name)

    async def fork_into(self, name: str, source: Source, origin: str = "") -> MicrovmSpace:
        """A new Space ``name`` as a fork of ``source`` (caller holds the lock); ``origin``
        is the checkpoint id it came from (kept from pruning while the Space lives)."""
        st = self.files.init_space(name)
        st.restored_from = origin
        async with self.files.lock("pool"):
            st.chain = [*source.chain, self.new_layer(source.chain[-1])]
            self.files.write(name, st)
        try:
            st = await self.start(name, st, source)
        except BaseException:
            self.kill(name)
            raise
        return self.space(name, st)

    async def ensure_running(self, name: str, st: MicrovmState) -> MicrovmSpace:
        """The Space, running: a machine that is down (host reboot, QEMU crash) boots its
        disk, as a machine would; one left half-way by a killed driver is finished."""
        if not qemu.alive(st.pid, st.pid_start):
            st.pending = ""  # a cold boot takes the Space's own token from fw_cfg
            st.frozen = False
            st = await self.start(name, st, None)
            return self.space(name, st)
        if st.frozen:
            return self.space(name, st)  # paused on purpose: it answers once resumed
        top = await qemu.settle(self.files.qmp_sock(name))
        if top is not None and top != st.chain[-1]:
            # Killed between the disk snapshot and recording it: the new top is real.
            if top in st.chain:
                raise SpaceError(f"the machine of {name!r} writes to {top}, not its chain's top")
            st.chain.append(top)
            self.files.write(name, st)
        if st.pending:
            old = read_text(st.pending, max_bytes=MAX_VALUE_BYTES).strip()
            await qemu.wait_health(st.port, self._host.settings.microvm_restore_timeout)
            self.spaces[name] = await self._after_restore(name, st, old)
            st.pending = ""
            self.files.write(name, st)
        return self.space(name, st)
