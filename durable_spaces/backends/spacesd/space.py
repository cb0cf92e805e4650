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
- Paths: ``confine()`` lexically, then every existing component is ``lstat``-ed through
  the daemon and a symlink among them is refused (``PathEscapeError``), as in
  ``local_fs``. There is a TOCTOU window between the check and the daemon's operation (a
  command running at the same moment could swap a directory for a symlink): the daemon
  has no ``openat``-style confined API to close it, so confinement here holds against
  paths the adapter is given, not against a concurrent hostile command.
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

import asyncio
import errno
import hashlib
import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, Literal

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

import cua

from durable_spaces.backends.spacesd import bulk
from durable_spaces.backends.spacesd.errormap import DaemonProbe, ErrorMap
from durable_spaces.backends.spacesd.execution import (
    RecordedExecution,
    SpacesdExecution,
    parse_record,
)
from durable_spaces.backends.spacesd.guest_journal import GuestJournal
from durable_spaces.backends.spacesd.mutate import (
    MUTATE,
    mutate_argv,
    mutate_error,
    stopped_reading,
)
from durable_spaces.backends.spacesd.runtime import check_exec_ledger, runtime
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
#: Daemon file operations that take ``user=`` (``upload`` takes it in its options).
_FILE_OPS = frozenset({"download", "make_dir", "remove", "stat", "list_dir", "move_path"})

#: When ``advance_epoch`` sweeps stray processes: never, when the floor rises, or always.
SweepWhen = Literal["never", "rise", "always"]

#: Stale files smaller than this are read whole by a scan and hashed here (``_hash_stale``),
#: at most ``KEEP_TOTAL`` bytes of them a scan; larger ones are hashed in the Space.
KEEP_MAX = 64 * 1024
KEEP_TOTAL = 8 << 20


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
        #: The SDK's own state (its sandbox registry): kept out of the user's ~/.cua.
        self._sdk_home = sdk_home
        self._client: Any = None
        self._lock = asyncio.Lock()
        self._scans = ScanCache()
        #: The bytes of the small files the last whole-workspace scan read
        #: (``_hash_stale``), by workspace path: ``read_files`` of them costs nothing more.
        self._kept: dict[str, bytes] = {}
        #: The change journal in the Space (``guest_journal``): a scan asks it first.
        self._guest = GuestJournal(
            self.root,
            self._start_journal,
            self._hash_files,
            probe.boot_id,
            KEEP_MAX,
            KEEP_TOTAL,
            self._scans.stats,
            user=user or "",
            journal=settings.space_journal,
        )
        #: The epoch this object last advanced the Space to: its helper commands run
        #: under it, so a driver's next successor kills one its death left waiting (an
        #: epoch-0 helper outlives every advance, e.g. an unfed ``xargs``).
        self._helper_epoch = 0

    def __repr__(self) -> str:  # never shows the token
        return f"SpacesdSpace({self.name!r}, {self._url!r})"

    @property
    def scan_stats(self) -> dict[str, int]:
        """Counters of the incremental scan (``ScanCache.stats``)."""
        return self._scans.stats

    # --- connection and errors ----------------------------------------------------------

    def _down(self, what: str) -> SpaceUnavailableError:
        return self._errors.down(what)

    def _map(self, e: BaseException) -> BaseException:
        return self._errors.map(e)

    async def _env(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    if self._probe.gone():
                        raise SpaceGoneError(f"Space {self.name!r} no longer exists")
                    try:
                        sb = (
                            await runtime(self._sdk_home)
                            .sandboxes()
                            .connect_url(self._url, self._token, f"ds-{self.name}")
                        )
                        self._client = await sb.spacesd(None)
                    except Exception as e:
                        raise self._map(e) from None
        return self._client

    async def _call(self, method: str, *args: Any, **kw: Any) -> Any:
        """SDK ``method`` of the daemon, its errors mapped. With a ``user``, the file
        operations run as that user too, like the commands."""
        if self._user is not None:
            if method in _FILE_OPS:
                kw.setdefault("user", self._user)
            elif method == "upload" and len(args) >= 3 and args[2] is not None:
                args[2].user = self._user
        env = await self._env()
        try:
            return await getattr(env, method)(*args, **kw)
        except Exception as e:
            raise self._map(e) from None

    async def _rpc(self, method: str, req: Mapping[str, Any]) -> dict[str, Any]:
        out = await self._call("call_json", f"ProcessService/{method}", json.dumps(req))
        return dict(json.loads(out or "{}"))

    async def close(self) -> None:
        await self._guest.reset("closed")
        self._client = None

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

    # --- paths -------------------------------------------------------------------------

    def _abs(self, rel: str) -> str:
        return self.root if rel == "." else posixpath.join(self.root, rel)

    async def _lstat(self, rel: str) -> Any | None:
        try:
            return await self._call("stat", self._abs(rel), no_follow=True)
        except (FileNotFoundError, NotADirectoryError):
            return None

    async def _resolve(self, path: str, *, follow_last: bool) -> str:
        return (await self._resolve_stat(path, follow_last=follow_last))[0]

    async def _resolve_stat(self, path: str, *, follow_last: bool) -> tuple[str, Any | None]:
        """Workspace-relative ``path``, after checking that no existing component is a
        symlink (inside-pointing or not, like the local backend: the adapter never needs
        to go through one). With ``follow_last=False`` the last component is not checked
        (lstat semantics: it is replaced, removed or described, never followed). Also the
        last component's lstat when it was looked at (None: missing or not looked at)."""
        rel = confine(self.root, path)
        parts = [] if rel == "." else rel.split("/")
        check = parts if follow_last else parts[:-1]
        last = None
        for i in range(len(check)):
            here = "/".join(parts[: i + 1])
            st = await self._lstat(here)
            if st is None:
                break  # nothing below a missing component exists yet
            if st.kind == "symlink":
                raise PathEscapeError(f"refusing to go through the symlink {here!r} ({path!r})")
            if i == len(parts) - 1:
                last = st
        return rel, last

    # --- files -------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        if not path:
            raise IsADirectoryError(errno.EISDIR, "the path is empty: name a file in the workspace")
        rel, st = await self._resolve_stat(path, follow_last=True)
        if rel != "." and st is None:
            raise FileNotFoundError(errno.ENOENT, f"no such file: {path!r}")
        if st is None or st.kind == "directory":
            raise IsADirectoryError(errno.EISDIR, f"{path!r} is a directory, not a file")
        if st.kind != "file":  # a FIFO would block the daemon's read forever
            raise IsADirectoryError(errno.EISDIR, f"{path!r} is not a regular file (a {st.kind})")
        return bytes(await self._call("download", self._abs(rel)))

    async def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """See ``Space.read_files``: the bytes the last scan read where it kept them all,
        else one ``tar`` stream through one command (``bulk``)."""
        wanted = bulk.wanted(self.root, paths)
        if wanted and all(rel in self._kept for rel in wanted.values()):
            return {p: self._kept[rel] for p, rel in wanted.items()}
        if len(wanted) <= 1:
            return {}  # one file: ``read_file`` is one transfer already, and cheaper
        rels = sorted(set(wanted.values()))
        ex, res = await self._run(bulk.read_argv(self.root), cwd="/", stdin=bulk.read_input(rels))
        return bulk.answer(wanted, ex.stdout() if res.exit_code == 0 else None)

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
        rel = await self._resolve(path, follow_last=False)
        st = await self._lstat(rel)
        if st is None:
            return None
        kind = {"file": "file", "directory": "dir", "symlink": "symlink"}.get(st.kind, "other")
        return FileStat(
            path=rel,
            kind=kind,
            mode=int(st.mode) & 0o777,
            size=int(st.size),
            mtime_ns=int(st.modified_ms or 0) * 1_000_000,
            target=st.symlink_target if kind == "symlink" else None,
        )

    async def list_dir(self, path: str = ".") -> list[str]:
        rel = await self._resolve(path, follow_last=True)
        entries = await self._call("list_dir", self._abs(rel), 1)
        return sorted(e.name for e in entries)

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
        top = await self._resolve(root, follow_last=True)
        excl = [confine(self.root, e) for e in exclude]
        if "." in excl:
            return {}
        entries = await self._guest.scan()
        if entries is not None:  # the journal vouches for the whole workspace
            if top != ".":
                st = await self._lstat(top)
                if st is None or st.kind != "directory":
                    return {}
            self._kept = self._guest.kept
            table = table_of(entries, top, excl, self._guest.cuts)
            self._scans.stats["scans"] += 1
            self._scans.stats["files"] = len(table)
            return table
        st = await self._lstat(top)
        if st is None or st.kind != "directory":
            return {}
        ex, res = await self._run(LIST_ARGV, cwd=self._abs(top))
        if res.exit_code != 0:
            raise SpaceError(f"scan failed: {res.output[-500:].decode(errors='replace')}")
        listing = self._scans.listing(top, ex.stdout(), excl)
        hashes, kept = await self._hash_stale(listing.stale, listing.table)
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

    async def _hash_stale(
        self, stale: list[str], table: PathTable
    ) -> tuple[dict[str, str], dict[str, bytes]]:
        """The sha256 of each file in ``stale`` (gone ones left out), and the bytes of
        those read whole: the small ones (under ``KEEP_MAX``, ``KEEP_TOTAL`` in all) come
        in one ``tar`` (``bulk``) and are hashed here, so transactional mode's read of
        what a command changed is answered from them (one command fewer per call, the
        dearest part of a microvm call under TCG); the rest, and any the stream left out or
        could not give (changed while read, no longer a regular file), are hashed in the Space."""
        hashes: dict[str, str] = {}
        kept: dict[str, bytes] = {}
        small: list[str] = []
        total = 0
        for name in stale:
            size = table[name].size or 0
            if size < KEEP_MAX and total + size <= KEEP_TOTAL:
                small.append(name)
                total += size
        if len(small) > 1:  # one file: ``HASH_ARGV`` is one command already
            ex, res = await self._run(
                bulk.read_argv(self.root), cwd="/", stdin=bulk.read_input(small)
            )
            if res.exit_code == 0:
                kept = bulk.parse(ex.stdout(), set(small))
                hashes = {n: hashlib.sha256(data).hexdigest() for n, data in kept.items()}
        rest = [n for n in stale if n not in hashes]
        if rest:
            hashes.update(await self._hash_files(rest))
        return hashes, kept
