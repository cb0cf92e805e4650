"""A Space reached through a cua-spacesd daemon, whatever runs the daemon.

Everything goes through the daemon's API via the ``cua`` SDK (commands, the exec ledger,
the epoch fence, files), so the same class serves a daemon on this host (``spacesd``), in
a container (``docker``) or in a VM (``microvm``): the backend says where the daemon
listens, gives a ``DaemonProbe`` that tells a down daemon from a deleted Space, and, in a
subclass, fills the hooks for what its machine adds (``_sweep_when``/``_sweep_strays``:
processes the daemon does not track). A ``user`` runs commands and file operations alike.

Decisions worth knowing:

- Every keyed call reads ``GetExecRecord`` first (it also returns the epoch floor). An
  EXITED or LOST key is replayed from the record (its 64 KiB tail) without a spawn, after
  the same stale-epoch check the daemon would make; a RUNNING one is reattached through
  ``spawn``, which the daemon dedupes on the key, so a racing second client can only
  make the ``reattached`` flag stale, never run the command twice. A key the caller
  vouches new (``new_key``: the adapter's key of a call it just marked started) skips
  the read: one round trip less per wrapped command; the daemon's dedupe (an
  EXITED or LOST key's spawn answers with its old process, never a new run) is what
  keeps a wrongly vouched key from running twice. Following a command
  is ``execution``'s part; reading SDK errors, ``errormap``'s.
- Paths are confined lexically and checked through the daemon for symlinks on the
  way (``files``).
- The daemon treats a command whose epoch is above the floor as an ``AdvanceEpoch``
  first: the floor rises and processes of older epochs are killed. Newer writers fence
  older ones without an explicit ``advance_epoch``.
- Every mutation of the workspace (write, symlink, remove) is one command carrying the
  caller's epoch (``mutate``). Reads (download, stat, list, scan) stay on the file API
  or on epoch-0 helpers.
- Epoch 0 means "no epoch" to the daemon (the protobuf default): such a command is never
  refused and never killed by ``advance_epoch``. The adapter's epochs start at 1; the
  read-only helpers (scan, hash) use 0 on purpose.
"""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, Literal

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

import cua

from durable_spaces.backends.spacesd import bulk
from durable_spaces.backends.spacesd.connection import DaemonConnection
from durable_spaces.backends.spacesd.errormap import DaemonProbe, ErrorMap
from durable_spaces.backends.spacesd.execution import (
    RecordedExecution,
    SpacesdExecution,
    parse_record,
)
from durable_spaces.backends.spacesd.files import DaemonFiles
from durable_spaces.backends.spacesd.guest_journal import GuestJournal
from durable_spaces.backends.spacesd.mutate import (
    MUTATE,
    mutate_argv,
    mutate_error,
    stopped_reading,
)
from durable_spaces.backends.spacesd.runtime import check_exec_ledger
from durable_spaces.backends.spacesd.scan import (
    HASH_ARGV,
    LIST_ARGV,
    ScanCache,
    hash_input,
    parse_hashes,
    table_of,
)
from durable_spaces.chaos import mutants
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import (
    PathEscapeError,
    SpaceError,
    SpaceGoneError,
    SpaceUnavailableError,
    StaleEpochError,
)
from durable_spaces.settings import DEFAULTS, Settings
from durable_spaces.space import (
    EXEC_LEDGER,
    Capabilities,
    ExecRecord,
    ExecResult,
    ExecState,
    FileStat,
    OutputCallback,
    PathTable,
    confine,
)

__all__ = ["MUTATE", "DaemonProbe", "SpacesdSpace", "check_exec_ledger"]

_EPOCH_PROBE_KEY = "durable-spaces:epoch-probe"

#: When ``advance_epoch`` sweeps stray processes: never, when the floor rises, or always.
SweepWhen = Literal["never", "rise", "always"]


class SpacesdSpace:
    """A Space whose machine runs a cua-spacesd daemon at ``url``."""

    def __init__(
        self,
        name: str,
        root: str,
        instance_id: str,
        url: str,
        token: str,
        probe: DaemonProbe,
        *,
        kind: str = "process",
        user: str | None = None,
        sdk_home: str | None = None,
        settings: Settings = DEFAULTS,
    ) -> None:
        self.name = name
        #: The product's settings (``durable_spaces/settings.py``), its backend's.
        self.settings = settings
        self.root = posixpath.normpath(root)
        self.instance_id = instance_id
        self.kind = kind
        self._url = url
        self._token = token
        self._probe = probe
        self._errors = ErrorMap(name, token, probe)
        self._user = user
        self._sdk_home = sdk_home
        self._daemon = DaemonConnection(name, url, token, probe, self._errors, user, sdk_home)
        self._scans = ScanCache()
        #: The bytes of the small files the last whole-workspace scan read
        #: (``bulk.hash_stale``), by workspace path: ``read_files`` of them costs nothing more.
        self._kept: dict[str, bytes] = {}
        #: The change journal in the Space (``guest_journal``): a scan asks it first.
        self._guest = GuestJournal(
            self.root,
            self._start_journal,
            self._hash_files,
            probe.boot_id,
            bulk.KEEP_MAX,
            bulk.KEEP_TOTAL,
            self._scans.stats,
            user=user or "",
            journal=settings.space_journal,
        )
        #: The epoch this object last advanced the Space to: its helper commands run
        #: under it, so a driver's next successor kills one its death left waiting (an
        #: epoch-0 helper outlives every advance, e.g. an unfed ``xargs``).
        self._helper_epoch = 0
        #: Its reads through the daemon's file API, paths confined (``files``).
        self._files = DaemonFiles(self.root, self._call)

    def __repr__(self) -> str:  # never shows the token
        return f"SpacesdSpace({self.name!r}, {self._url!r})"

    @property
    def scan_stats(self) -> dict[str, int]:
        """Counters of the incremental scan (``ScanCache.stats``)."""
        return self._scans.stats

    # --- connection and errors ----------------------------------------------------------

    def _down(self, what: str) -> SpaceUnavailableError:
        return self._errors.down(what)

    async def _call(self, method: str, *args: Any, **kw: Any) -> Any:
        """``DaemonConnection.call``."""
        return await self._daemon.call(method, *args, **kw)

    async def _rpc(self, method: str, req: Mapping[str, Any]) -> dict[str, Any]:
        return await self._daemon.rpc(method, req)

    def disconnect(self) -> None:
        """Drop the daemon's SDK client (its daemon restarted, or its token changed):
        the next call connects again."""
        self._daemon.drop()

    async def close(self) -> None:
        await self._guest.reset("closed")
        self._daemon.drop()

    # --- capabilities, ledger, epoch -------------------------------------------------------

    async def capabilities(self) -> Capabilities:
        caps = await self._call("capabilities")
        features = frozenset(f.name for f in caps.features if f.supported)
        return Capabilities(
            kind=self.kind,
            exec_ledger=EXEC_LEDGER in features,
            machine_checkpoints=False,
            features=features,
        )

    async def require_exec_ledger(self) -> None:
        check_exec_ledger(await self._call("capabilities"))

    async def exec_record(self, key: str) -> ExecRecord:
        return (await self._record(key))[0]

    async def _record(self, key: str) -> tuple[ExecRecord, int]:
        """The ledger's record of ``key`` and the Space's epoch floor, in one call."""
        resp = await self._rpc("GetExecRecord", {"requestId": key})
        floor = int(resp.get("epoch", 0))
        return parse_record(key, resp.get("record")), floor

    async def current_epoch(self) -> int:
        return await self._daemon_epoch()

    async def _daemon_epoch(self) -> int:
        """The daemon's own floor (a subclass may keep another beside it)."""
        resp = await self._rpc("GetExecRecord", {"requestId": _EPOCH_PROBE_KEY})
        return int(resp.get("epoch", 0))

    async def advance_epoch(self, epoch: int) -> None:
        """The daemon kills every process started under an older epoch, then raises the
        floor; a lower epoch is refused (FailedPrecondition, mapped to StaleEpochError).
        Then, as ``_sweep_when`` says, ``_sweep_strays``: the daemon kills only the
        commands it tracks, not their background leftovers nor a killed daemon's orphans."""
        when = self._sweep_when()
        before = await self._daemon_epoch() if when == "rise" else 0
        if epoch < before:
            raise StaleEpochError(epoch, before, "space")
        await self._guest.reset("a new epoch")  # its helper would be killed with the rest
        await self._rpc("AdvanceEpoch", {"epoch": epoch})
        self._helper_epoch = max(self._helper_epoch, epoch)
        if when == "always" or (when == "rise" and epoch > before):
            try:
                await self._sweep_strays()
            except SpaceGoneError:
                raise
            except Exception as e:
                raise self._down(f"sweeping stray processes failed: {e}") from None

    def _sweep_when(self) -> SweepWhen:
        """When ``advance_epoch`` sweeps: a hook (this base never does)."""
        return "never"

    async def _sweep_strays(self) -> None:
        """Kill the Space's processes its daemon does not track: a hook."""

    # --- commands ----------------------------------------------------------------------

    def _cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.root
        return cwd if posixpath.isabs(cwd) else posixpath.join(self.root, cwd)

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        key: str | None,
        epoch: int,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        on_output: OutputCallback | None = None,
        stdin: bool = False,
        keep_output: int | None = None,
        new_key: bool = False,
        as_daemon: bool = False,
    ) -> SpacesdExecution | RecordedExecution:
        """``Space.spawn``; ``as_daemon``: as the daemon's own user, not the Space's (the
        journal's helper, which the Space's user must not be able to signal or trace)."""
        if not argv:
            raise ValueError("empty argv")
        prior = ExecState.UNKNOWN
        if key is not None and not new_key:
            # A key vouched new skips this round trip (``Space.spawn``): the daemon dedupes
            # its spawn on the key, so one that was not new still never runs twice.
            rec, floor = await self._record(key)
            prior = rec.state
            if prior in (ExecState.EXITED, ExecState.LOST):
                # Replay from the ledger itself (its 64 KiB tail), fenced like a spawn.
                if epoch < floor:
                    raise StaleEpochError(epoch, floor, "space")
                return RecordedExecution(rec, on_output)
        boot = self._probe.boot_id()
        cmd = cua.SpacesdCommand(
            program=argv[0],
            args=list(argv[1:]),
            env=dict(env or {}),
            cwd=self._cwd(cwd),
            user=None if as_daemon else self._user,
            request_id=key,
            epoch=epoch,
            stdin=stdin,
        )
        proc = await self._call("spawn", cmd)
        return SpacesdExecution(
            self._errors,
            proc,
            key,
            boot,
            reattached=prior == ExecState.RUNNING,
            replayed=prior in (ExecState.EXITED, ExecState.LOST),
            lost=prior == ExecState.LOST,
            on_output=on_output,
            keep_output=keep_output,
        )

    async def exec(
        self,
        argv: Sequence[str],
        *,
        key: str | None,
        epoch: int,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        on_output: OutputCallback | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        if stdin is not None and key is not None:
            raise ValueError("stdin is only supported with key=None (a replay could not feed it)")
        ex = await self.spawn(
            argv,
            key=key,
            epoch=epoch,
            cwd=cwd,
            env=env,
            on_output=on_output,
            stdin=stdin is not None,
        )
        if stdin is not None:
            await self._feed(ex, stdin)
        return await ex.wait()

    async def _feed(self, ex: SpacesdExecution | RecordedExecution, data: bytes) -> None:
        await ex.feed(data)

    async def _run(
        self, argv: Sequence[str], *, cwd: str, stdin: bytes | None = None
    ) -> tuple[SpacesdExecution | RecordedExecution, ExecResult]:
        """A ledger-less helper command under ``_helper_epoch``; the execution after exit."""
        ex = await self.spawn(
            argv, key=None, epoch=self._helper_epoch, cwd=cwd, stdin=stdin is not None
        )
        if stdin is not None:
            await self._feed(ex, stdin)
        res = await ex.wait()
        return ex, res

    # --- files -------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        return await self._files.read_file(path)

    async def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """See ``Space.read_files``: the bytes the last scan read where it kept them all,
        else one ``tar`` stream through one command (``bulk``)."""
        wanted = bulk.wanted(self.root, paths)
        if wanted and all(rel in self._kept for rel in wanted.values()):
            return {p: self._kept[rel] for p, rel in wanted.items()}
        if len(wanted) <= 1:
            return {}  # one file: ``read_file`` is one transfer already, and cheaper
        return bulk.answer(wanted, await self._tar(sorted(set(wanted.values()))))

    async def _tar(self, rels: list[str]) -> bytes | None:
        """One ``tar`` stream of the workspace files ``rels`` (``bulk``); None when it
        did not exit 0."""
        ex, res = await self._run(bulk.read_argv(self.root), cwd="/", stdin=bulk.read_input(rels))
        return ex.stdout() if res.exit_code == 0 else None

    async def write_file(
        self, path: str, data: bytes, mode: int | None = None, *, epoch: int
    ) -> None:
        # The size goes with the bytes: a stream cut short (the caller killed mid-upload)
        # ends ``cat`` early, and a prefix must never be renamed into place.
        octal = "" if mode is None else f"{mode & 0o7777:o}"
        await self._mutate("write", path, epoch, f"{octal}:{len(data)}", stdin=bytes(data))

    async def symlink(self, path: str, target: str, *, epoch: int) -> None:
        await self._mutate("symlink", path, epoch, target)

    async def stat(self, path: str) -> FileStat | None:
        return await self._files.stat(path)

    async def list_dir(self, path: str = ".") -> list[str]:
        return await self._files.list_dir(path)

    async def remove(self, path: str, recursive: bool = False, *, epoch: int) -> None:
        await self._mutate("remove", path, epoch, "r" if recursive else "")

    @property
    def _staging(self) -> str:
        return posixpath.join(posixpath.dirname(self.root.rstrip("/")), ".ds-staging")

    async def _mutate(
        self, op: str, path: str, epoch: int, arg: str, stdin: bytes | None = None
    ) -> None:
        """One workspace mutation as one command carrying ``epoch``: the daemon's file API
        has no epoch field, its commands do (a stale one is refused before it starts, and
        one running when the floor rises is killed by the advance). See ``MUTATE``."""
        rel = confine(self.root, path)
        if rel == ".":
            if op == "remove":
                raise PathEscapeError("refusing to remove the workspace root")
            raise IsADirectoryError(errno.EISDIR, f"cannot {op} the workspace root")
        argv = mutate_argv(op, self.root, self._staging, arg, rel)
        fenced = 0 if mutants.active("unfenced_mutations") else epoch  # 0: never refused
        hit("space.mutate")  # a driver paused here is continued straight into the request
        ex = await self.spawn(argv, key=None, epoch=fenced, cwd="/", stdin=stdin is not None)
        if stdin is not None:
            hit("space.mutate_started")  # running in the Space, its bytes not sent yet
            try:
                await self._feed(ex, stdin)
            except SpaceError as e:
                if not stopped_reading(e):
                    raise
                # It refused before reading (a symlink on the way): its exit says why.
        res = await ex.wait()
        if res.exit_code == 0:
            return
        floor = await self.current_epoch()
        if floor > epoch:  # the floor rose while it ran: the advance killed it
            raise StaleEpochError(epoch, floor, "space")
        raise mutate_error(op, path, res)

    # --- scan --------------------------------------------------------------------------

    async def scan(self, root: str = ".", exclude: Sequence[str] = ()) -> PathTable:
        """One ``find`` for the listing with stat keys, one ``sha256sum`` for the files
        whose (size, mtime, inode, ctime) changed since this object's last scan (see
        ``scan``). As in ``local_fs``, ``exclude`` holds workspace paths."""
        top = await self._files.resolve(root, follow_last=True)
        excl = [confine(self.root, e) for e in exclude]
        if "." in excl:
            return {}
        entries = await self._guest.scan()
        if entries is not None:  # the journal vouches for the whole workspace
            if top != ".":
                st = await self._files.lstat(top)
                if st is None or st.kind != "directory":
                    return {}
            self._kept = self._guest.kept
            table = table_of(entries, top, excl, self._guest.cuts)
            self._scans.stats["scans"] += 1
            self._scans.stats["files"] = len(table)
            return table
        st = await self._files.lstat(top)
        if st is None or st.kind != "directory":
            return {}
        ex, res = await self._run(LIST_ARGV, cwd=self._files.abs(top))
        if res.exit_code != 0:
            raise SpaceError(f"scan failed: {res.output[-500:].decode(errors='replace')}")
        listing = self._scans.listing(top, ex.stdout(), excl)
        hashes, kept = await bulk.hash_stale(
            listing.stale, listing.table, self._tar, self._hash_files
        )
        table = self._scans.table(listing, hashes)
        self._kept = kept
        return table

    async def _start_journal(self, argv: Sequence[str]) -> SpacesdExecution:
        """The journal's helper, under the helper epoch (an advance kills it with the rest
        of the older epoch's commands), started as the daemon's user: where that is
        another than the Space's (root, in a container or a VM), the helper reads the
        workspace with the Space's user's effective ids but keeps its real and saved ids,
        so a command cannot signal, trace or open it (``docs/journal-trust.md``). Its
        working directory is ``/``: nothing of the workspace is on its way to perl."""
        ex = await self.spawn(
            argv,
            key=None,
            epoch=self._helper_epoch,
            cwd="/",
            stdin=True,
            keep_output=0,
            as_daemon=True,
        )
        if not isinstance(ex, SpacesdExecution):  # key=None: never a replay
            raise SpaceError("the journal's helper was not started")
        return ex

    async def machine_boot_id(self) -> str | None:
        """See ``host.boot.MachineBoot``: the journal's helper reads it, when one runs."""
        return await self._guest.boot_id()

    async def _hash_files(self, names: list[str]) -> dict[str, str]:
        """The sha256 of the workspace files ``names`` (those that could be hashed)."""
        ex, _ = await self._run(HASH_ARGV, cwd=self.root, stdin=hash_input(names))
        return parse_hashes(ex.stdout())
