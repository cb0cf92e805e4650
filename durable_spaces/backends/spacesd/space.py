"""A Space reached through a cua-spacesd daemon, whatever runs the daemon.

Everything goes through the daemon's API via the ``cua`` SDK (commands, the exec ledger,
the epoch fence, files), so the same class serves a daemon on this host (``spacesd``), in
a container or in a VM: the backend only says where the daemon listens and gives a
``DaemonProbe`` that tells a down daemon from a deleted Space.

Decisions worth knowing:

- Every keyed call reads ``GetExecRecord`` first (it also returns the epoch floor). An
  EXITED or LOST key is replayed from the record (its 64 KiB tail) without a spawn, after
  the same stale-epoch check the daemon would make; a RUNNING one is reattached through
  ``spawn``, which the daemon dedupes on the key, so a racing second client can only
  make the ``reattached`` flag stale, never run the command twice.
- The SDK's output stream reconnects on its own when the daemon goes away, and would
  follow a *new* process with the same pid after a restart. So every event is checked
  against the daemon's boot identity, and a pending read is abandoned (``SpaceUnavailable``)
  when the daemon is down: a restart is never mistaken for a command's exit.
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
  caller's epoch (``MUTATE``): the daemon's file API has no epoch field, its commands do.
  A stale one is refused before it starts; one still running when the floor rises is
  killed by the advance, and its temporary never reaches the workspace. Reads (download,
  stat, list, scan) stay on the file API or on epoch-0 helpers.
- Epoch 0 means "no epoch" to the daemon (the protobuf default): such a command is never
  refused and never killed by ``advance_epoch``. The adapter's epochs start at 1; the
  read-only helpers (scan, hash) use 0 on purpose.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import json
import os
import posixpath
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

import cua

from durable_spaces.chaos import mutants
from durable_spaces.chaos.failpoints import hit
from durable_spaces.errors import (
    CapabilityMissingError,
    PathEscapeError,
    SpaceError,
    SpaceGoneError,
    SpaceUnavailableError,
    StaleEpochError,
)
from durable_spaces.space import (
    EXEC_LEDGER,
    MAX_SCAN_DEPTH,
    BoundedOutput,
    Capabilities,
    ExecRecord,
    ExecResult,
    ExecState,
    FileStat,
    OutputCallback,
    PathEntry,
    PathTable,
    confine,
    name_problem,
    unsupported,
)

_STALE = re.compile(r"epoch (\d+) is older than the Space's current epoch (\d+)")
_STATES = {
    "EXEC_STATE_RUNNING": ExecState.RUNNING,
    "EXEC_STATE_EXITED": ExecState.EXITED,
    "EXEC_STATE_LOST": ExecState.LOST,
}
#: How often a pending output read checks that the daemon is still the same one.
WATCH_INTERVAL = 0.5
_EPOCH_PROBE_KEY = "durable-spaces:epoch-probe"
#: Timestamps this close to a scan's start are not trusted for caching (as local_fs).
RACY_SECONDS = 0.05
_STDIN_CHUNK = 1 << 20

#: The one script every workspace mutation runs (arguments only, never interpolated):
#: ``op root staging arg component...``. It walks from the root one component at a time,
#: refusing any symlink on the way (as local_fs does with O_NOFOLLOW), creating missing
#: directories for write/symlink, then acts on the last component without following it.
#: A write goes to a temporary in ``staging`` (beside the workspace, same filesystem) and
#: is renamed into place: a kill leaves the old file or the new, and nothing in the
#: workspace. There is a window between a component's check and the next step that a
#: concurrent hostile command could use; the daemon has no openat-style API to close it.
MUTATE = r"""
op=$1 root=$2 stage=$3 arg=$4; shift 4
cd -P -- "$root" || exit 90
while [ $# -gt 1 ]; do
  c=$1; shift
  [ -L "$c" ] && { echo "symlink: $c" >&2; exit 91; }
  if [ ! -e "$c" ]; then
    [ "$op" = remove ] && exit 0
    mkdir -- "$c" 2>/dev/null || [ -d "$c" ] || exit 92
    [ -L "$c" ] && exit 91
  fi
  cd -P -- "$c" 2>/dev/null || exit 93
done
leaf=$1
case $op in
write)
  [ -d "$leaf" ] && [ ! -L "$leaf" ] && exit 94
  mode=${arg%:*} size=${arg#*:}
  if [ -z "$mode" ]; then
    if [ -f "$leaf" ] && [ ! -L "$leaf" ]; then mode=$(stat -c %a -- "$leaf"); else mode=644; fi
  fi
  mkdir -p -- "$stage" && tmp=$(mktemp -p "$stage" .w.XXXXXXXX) || exit 95
  if cat > "$tmp" && [ "$(stat -c %s -- "$tmp")" = "$size" ] && chmod -- "$mode" "$tmp" &&
     mv -fT -- "$tmp" "$leaf"; then exit 0; fi
  rm -f -- "$tmp"; exit 96 ;;
symlink)
  [ -d "$leaf" ] && [ ! -L "$leaf" ] && exit 94
  mkdir -p -- "$stage" && tmp=$(mktemp -u -p "$stage" .l.XXXXXXXX) || exit 95
  if ln -s -- "$arg" "$tmp" && mv -fT -- "$tmp" "$leaf"; then exit 0; fi
  rm -f -- "$tmp"; exit 96 ;;
remove)
  [ -e "$leaf" ] || [ -L "$leaf" ] || exit 0
  if [ -d "$leaf" ] && [ ! -L "$leaf" ]; then
    if [ "$arg" = r ]; then rm -rf -- "$leaf" || exit 96
    else rmdir -- "$leaf" 2>/dev/null || exit 98; fi
  else rm -f -- "$leaf" || exit 96; fi ;;
esac
"""
_MUTATE_ERRORS: dict[int, tuple[type[OSError], int, str]] = {
    90: (FileNotFoundError, errno.ENOENT, "the workspace is missing"),
    92: (OSError, errno.EIO, "cannot create a parent directory"),
    93: (NotADirectoryError, errno.ENOTDIR, "a parent is not a directory"),
    94: (IsADirectoryError, errno.EISDIR, "is a directory"),
    98: (OSError, errno.ENOTEMPTY, "directory not empty"),
}


class DaemonProbe(Protocol):
    """What the backend knows about its daemon without asking it."""

    def boot_id(self) -> str | None:
        """Identity of the running daemon (changes on each start); None when it is down."""
        ...

    def gone(self) -> bool:
        """The Space was deleted (or replaced by a new instance under its name)."""
        ...


def check_exec_ledger(caps: Any) -> None:
    """Refuse a daemon that does not report ``process.exec_ledger`` as supported.

    ``caps`` is a ``cua.SpacesdCapabilities`` (or anything with ``features`` of objects
    with ``name`` and ``supported``)."""
    for f in caps.features:
        if f.name == EXEC_LEDGER and f.supported:
            return
    version = getattr(caps, "version", "?")
    raise CapabilityMissingError(
        f"cua-spacesd {version} does not report {EXEC_LEDGER!r}: without an exec ledger "
        "commands could run twice after a crash; use a daemon that has it"
    )


_runtimes: dict[str | None, Any] = {}


def _runtime(sdk_home: str | None) -> Any:
    """One SDK runtime per state dir, shared by the Spaces that use it (each runtime has
    its own threads; one per Space would grow with the number of Spaces)."""
    rt = _runtimes.get(sdk_home)
    if rt is None:
        rt = _runtimes[sdk_home] = cua.embedded(state_dir=sdk_home, spaces_home=sdk_home)
    return rt


def _b64(s: str | None) -> bytes:
    return base64.b64decode(s) if s else b""


def _exit_fields(info: Any, lost: bool) -> tuple[int | None, int | None, bytes]:
    """(exit_code, signal, extra output) from an SDK ``ExitInfo``.

    A command the daemon could not start (``error`` with no code) gets 127 and the error
    as output, like a shell; a LOST one has no status at all."""
    if info is None or lost:
        return None, None, b""
    if info.code is not None:
        return int(info.code), None, b""
    if info.signal_number:
        return None, int(info.signal_number), b""
    if info.error:
        return 127, None, f"cua-spacesd: {info.error}\n".encode()
    return None, None, b""


def _parse_record(key: str, rec: Any) -> ExecRecord:
    if not rec:
        return ExecRecord(key=key, state=ExecState.UNKNOWN)
    state = _STATES.get(str(rec.get("state")), ExecState.UNKNOWN)
    end = rec.get("end") or {}
    code: int | None = end.get("exitCode")
    sig: int | None = end.get("signalNumber")
    if state == ExecState.EXITED and code is None and sig is None:
        code = 127 if end.get("error") else 0
    tail = b"".join(
        _b64(part.get("stdout") or part.get("stderr") or part.get("pty"))
        for part in rec.get("tail") or []
    )
    pid = rec.get("pid")
    return ExecRecord(
        key=key,
        state=state,
        epoch=int(rec.get("epoch", 0)),
        pid=int(pid) if pid else None,
        exit_code=None if code is None else int(code),
        signal=None if sig is None else int(sig),
        output_tail=tail,
    )


class SpacesdExecution:
    """A command followed through the daemon's output stream."""

    def __init__(
        self,
        space: SpacesdSpace,
        proc: Any,
        key: str | None,
        boot: str | None,
        *,
        reattached: bool,
        replayed: bool,
        lost: bool,
        on_output: OutputCallback | None = None,
        keep_output: int | None = None,
    ) -> None:
        self.key = key
        self.pid: int | None = int(proc.pid()) or None
        self.reattached = reattached
        self.replayed = replayed
        self._lost = lost
        self._space = space
        self._proc = proc
        self._boot = boot
        self._on_output = on_output
        self._out = BoundedOutput(keep_output)
        #: Only helpers that parse their stdout (unbounded) keep it apart.
        self._stdout: bytearray | None = bytearray() if keep_output is None else None
        self._exit: Any = None
        self._done = False
        self._pending: asyncio.Future[Any] | None = None

    async def _next_event(self) -> Any:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._proc.next_event())
        while True:
            done, _ = await asyncio.wait({self._pending}, timeout=WATCH_INTERVAL)
            if done:
                break
            if self._space._probe.boot_id() != self._boot:
                self._pending.cancel()
                self._pending = None
                raise self._space._down("the Space's daemon stopped while the command ran")
        fut, self._pending = self._pending, None
        try:
            ev = fut.result()
        except cua.CuaError as e:
            if isinstance(e, cua.CuaError.NotFound):
                raise self._space._down(
                    "the Space's daemon restarted while the command ran"
                ) from None
            raise self._space._map(e) from None
        if self._space._probe.boot_id() != self._boot:
            raise self._space._down("the Space's daemon restarted while the command ran")
        return ev

    async def _next_chunk(self) -> bytes | None:
        while not self._done:
            ev = await self._next_event()
            if ev is None:
                self._done = True
                break
            if ev.kind == cua.ProcessEventKind.EXIT:
                self._exit = ev.exit
                continue
            data = bytes(ev.data)
            if not data:
                continue
            self._out.add(data)
            if ev.kind == cua.ProcessEventKind.STDOUT and self._stdout is not None:
                self._stdout += data
            if self._on_output is not None:
                self._on_output(data)
            return data
        return None

    async def output(self) -> AsyncIterator[bytes]:
        while (chunk := await self._next_chunk()) is not None:
            yield chunk

    async def wait(self) -> ExecResult:
        while await self._next_chunk() is not None:
            pass
        code, sig, extra = _exit_fields(self._exit, self._lost)
        if extra:
            self._out.add(extra)
        return ExecResult(
            key=self.key,
            exit_code=code,
            signal=sig,
            output=self._out.value(),
            replayed=self.replayed,
            reattached=self.reattached,
            output_bytes=self._out.total,
        )

    async def detach(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if not self._done:
            self._done = True
            try:
                await self._proc.detach()
            except cua.CuaError as e:
                raise self._space._map(e) from None

    def stdout(self) -> bytes:
        """Only stdout (for helpers that parse it; empty when ``keep_output`` bounded it)."""
        return bytes(self._stdout or b"")


class RecordedExecution:
    """A replay: the command already ended (or was lost); nothing runs."""

    def __init__(self, rec: ExecRecord, on_output: OutputCallback | None = None) -> None:
        self.key: str | None = rec.key
        self.pid = rec.pid
        self.reattached = False
        self.replayed = True
        self._rec = rec
        self._on_output = on_output
        self._sent = False

    async def output(self) -> AsyncIterator[bytes]:
        if not self._sent:
            self._sent = True
            if self._rec.output_tail:
                if self._on_output is not None:
                    self._on_output(self._rec.output_tail)
                yield self._rec.output_tail

    async def wait(self) -> ExecResult:
        async for _ in self.output():
            pass
        return ExecResult(
            key=self.key,
            exit_code=self._rec.exit_code,
            signal=self._rec.signal,
            output=self._rec.output_tail,
            replayed=True,
        )

    async def detach(self) -> None:
        self._sent = True

    def stdout(self) -> bytes:
        return self._rec.output_tail


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
    ) -> None:
        self.name = name
        self.root = posixpath.normpath(root)
        self.instance_id = instance_id
        self.kind = kind
        self._url = url
        self._token = token
        self._probe = probe
        self._user = user
        #: The SDK's own state (its sandbox registry): kept out of the user's ~/.cua.
        self._sdk_home = sdk_home
        self._client: Any = None
        self._lock = asyncio.Lock()
        self._hash_cache: dict[str, tuple[str, str]] = {}  # rel -> (stat key, sha256)
        #: Like ``local_fs.Scanner.stats``: ``hashed`` counts files read (cumulative),
        #: ``files`` the entries of the last scan.
        self.scan_stats: dict[str, int] = {"hashed": 0, "scans": 0, "files": 0}

    def __repr__(self) -> str:  # never shows the token
        return f"SpacesdSpace({self.name!r}, {self._url!r})"

    # --- connection and errors ----------------------------------------------------------

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    def _down(self, what: str) -> SpaceUnavailableError:
        if self._probe.gone():
            return SpaceGoneError(f"Space {self.name!r} no longer exists ({what})")
        return SpaceUnavailableError(f"Space {self.name!r} is unavailable: {what}")

    def _map(self, e: BaseException) -> BaseException:
        """An SDK error as one of ours: a stale epoch, a down or deleted Space, or the
        ``OSError`` a file operation would raise. Never a command failure."""
        msg = self._scrub(str(e))
        m = _STALE.search(msg)
        if m:
            return StaleEpochError(int(m.group(1)), int(m.group(2)), "space")
        E = cua.CuaError
        if not isinstance(e, E) or isinstance(
            e,
            (
                E.Transport,
                E.SpacesdNotAvailable,
                E.Timeout,
                E.Closed,
                E.Unauthenticated,
                E.DaemonNotRunning,
                E.Cancelled,
            ),
        ):
            return self._down(msg)
        if any(t in msg for t in ("(Cancelled)", "(Unavailable)", "operation was canceled")):
            return self._down(msg)  # an RPC cut by the daemon going away (gRPC status)
        if isinstance(e, E.NotFound):
            if "process not found" in msg:
                return self._down(msg)
            return FileNotFoundError(errno.ENOENT, msg)
        if isinstance(e, E.PermissionDenied):
            return PermissionError(errno.EACCES, msg)
        low = msg.lower()
        if "not a directory" in low:
            return NotADirectoryError(errno.ENOTDIR, msg)
        if "is a directory" in low:
            return IsADirectoryError(errno.EISDIR, msg)
        if "directory not empty" in low:
            return OSError(errno.ENOTEMPTY, msg)
        if self._probe.gone():
            return SpaceGoneError(f"Space {self.name!r} no longer exists ({msg})")
        return SpaceError(f"cua-spacesd refused the request: {msg}")

    async def _env(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    if self._probe.gone():
                        raise SpaceGoneError(f"Space {self.name!r} no longer exists")
                    try:
                        sb = (
                            await _runtime(self._sdk_home)
                            .sandboxes()
                            .connect_url(self._url, self._token, f"ds-{self.name}")
                        )
                        self._client = await sb.spacesd(None)
                    except Exception as e:
                        raise self._map(e) from None
        return self._client

    async def _call(self, method: str, *args: Any, **kw: Any) -> Any:
        env = await self._env()
        try:
            return await getattr(env, method)(*args, **kw)
        except Exception as e:
            raise self._map(e) from None

    async def _rpc(self, method: str, req: Mapping[str, Any]) -> dict[str, Any]:
        out = await self._call("call_json", f"ProcessService/{method}", json.dumps(req))
        return dict(json.loads(out or "{}"))

    async def close(self) -> None:
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
        return _parse_record(key, resp.get("record")), floor

    async def current_epoch(self) -> int:
        resp = await self._rpc("GetExecRecord", {"requestId": _EPOCH_PROBE_KEY})
        return int(resp.get("epoch", 0))

    async def advance_epoch(self, epoch: int) -> None:
        # The daemon kills every process started under an older epoch, then raises the
        # floor; a lower epoch is refused (FailedPrecondition, mapped to StaleEpochError).
        await self._rpc("AdvanceEpoch", {"epoch": epoch})

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
    ) -> SpacesdExecution | RecordedExecution:
        if not argv:
            raise ValueError("empty argv")
        prior = ExecState.UNKNOWN
        if key is not None:
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
            user=self._user,
            request_id=key,
            epoch=epoch,
            stdin=stdin,
        )
        proc = await self._call("spawn", cmd)
        return SpacesdExecution(
            self,
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
        if isinstance(ex, RecordedExecution):
            return
        try:
            for i in range(0, len(data), _STDIN_CHUNK):
                await ex._proc.write_stdin(data[i : i + _STDIN_CHUNK])
            await ex._proc.close_stdin()
        except Exception as e:
            raise self._map(e) from None

    async def _run(self, argv: Sequence[str], *, cwd: str, stdin: bytes | None = None) -> Any:
        """A ledger-less, epoch-less helper command; returns the execution after exit."""
        ex = await self.spawn(argv, key=None, epoch=0, cwd=cwd, stdin=stdin is not None)
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
        rel, st = await self._resolve_stat(path, follow_last=True)
        if rel != "." and st is None:
            raise FileNotFoundError(errno.ENOENT, f"no such file: {path!r}")
        if st is None or st.kind != "file":
            # A FIFO would block the daemon's read forever; a directory is not a file.
            raise IsADirectoryError(errno.EISDIR, f"not a regular file: {path!r}")
        return bytes(await self._call("download", self._abs(rel)))

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
        argv = ["sh", "-c", MUTATE, "ds-mutate", op, self.root, self._staging, arg]
        fenced = 0 if mutants.active("unfenced_mutations") else epoch  # 0: never refused
        hit("space.mutate")  # a driver paused here is continued straight into the request
        ex = await self.spawn(
            [*argv, *rel.split("/")], key=None, epoch=fenced, cwd="/", stdin=stdin is not None
        )
        if stdin is not None:
            hit("space.mutate_started")  # running in the Space, its bytes not sent yet
            try:
                await self._feed(ex, stdin)
            except SpaceError as e:
                if "process has exited" not in str(e):
                    raise
                # It refused before reading (a symlink on the way): its exit says why.
        res = await ex.wait()
        if res.exit_code == 0:
            return
        floor = await self.current_epoch()
        if floor > epoch:  # the floor rose while it ran: the advance killed it
            raise StaleEpochError(epoch, floor, "space")
        why = res.output.decode(errors="replace").strip()[-300:]
        if res.exit_code == 91:
            raise PathEscapeError(f"refusing to go through a symlink ({path!r}): {why}")
        err = _MUTATE_ERRORS.get(res.exit_code or 0)
        if err is not None:
            raise err[0](err[1], f"{op} {path!r}: {why or err[2]}")
        raise SpaceError(f"{op} {path!r} failed ({res.exit_code}, signal {res.signal}): {why}")

    # --- scan --------------------------------------------------------------------------

    async def scan(self, root: str = ".", exclude: Sequence[str] = ()) -> PathTable:
        """One ``find`` for the listing with stat keys, one ``sha256sum`` for the files
        whose (size, mtime, inode, ctime) changed since this object's last scan. As in
        ``local_fs``, ``exclude`` holds workspace paths and a file touched within
        ``RACY_SECONDS`` of the scan is not cached (a same-tick rewrite looks unchanged)."""
        top = await self._resolve(root, follow_last=True)
        excl = [confine(self.root, e) for e in exclude]
        if "." in excl:
            return {}
        prefix = "" if top == "." else top + "/"
        st = await self._lstat(top)
        if st is None or st.kind != "directory":
            return {}
        fmt = r"%y\0%P\0%m\0%s\0%i\0%T@\0%C@\0%l\0"
        script = 'date +%s.%N && exec find . "(" -type f -o -type l ")" -printf "$1"'
        ex, res = await self._run(["sh", "-c", script, "sh", fmt], cwd=self._abs(top))
        if res.exit_code != 0:
            raise SpaceError(f"scan failed: {res.output[-500:].decode(errors='replace')}")
        now_line, _, listing = ex.stdout().partition(b"\n")
        racy_after = float(now_line) - RACY_SECONDS
        fields = listing.split(b"\0")
        table: PathTable = {}
        sigs: dict[str, tuple[str, bool]] = {}  # rel -> (stat key, cacheable)
        for i in range(0, len(fields) - 7, 8):
            typ, name_b, mode, size, ino, mtime, ctime, target = fields[i : i + 8]
            name = prefix + name_b.decode("utf-8", "surrogateescape")
            if any(name == x or name.startswith(x + "/") for x in excl):
                continue
            cut = _unrepresentable(name)
            if cut is not None:  # as local_fs: one entry where the image stops
                table[cut[0]] = unsupported(cut[1])
                continue
            if typ == b"l":
                tgt = target.decode("utf-8", "surrogateescape")
                table[name] = PathEntry(kind="symlink", mode=0o777, target=tgt)
                continue
            table[name] = PathEntry(kind="file", mode=int(mode, 8) & 0o777, size=int(size))
            key = b"|".join((size, ino, mtime, ctime)).decode()
            sigs[name] = (key, max(float(mtime), float(ctime)) < racy_after)
        stale = [n for n, (k, _) in sigs.items() if self._hash_cache.get(n, ("", ""))[0] != k]
        hashes = await self._hash(stale) if stale else {}
        fresh: dict[str, tuple[str, str]] = {}
        for name, (key, cacheable) in sigs.items():
            sha = hashes[name] if name in hashes else self._hash_cache.get(name, ("", ""))[1]
            if name in stale and name not in hashes:  # vanished between find and sha256sum
                del table[name]
                continue
            if cacheable:
                fresh[name] = (key, sha)
            e = table[name]
            table[name] = PathEntry(kind="file", mode=e.mode, size=e.size, sha256=sha)
        if top == ".":
            self._hash_cache = fresh
        else:
            for k in [k for k in self._hash_cache if k.startswith(prefix)]:
                del self._hash_cache[k]
            self._hash_cache.update(fresh)
        self.scan_stats["hashed"] += len(stale)
        self.scan_stats["scans"] += 1
        self.scan_stats["files"] = len(table)
        return table

    async def _hash(self, names: list[str]) -> dict[str, str]:
        ex, _ = await self._run(
            ["xargs", "-0", "-r", "sha256sum", "-z", "--"],
            cwd=self.root,
            stdin=b"\0".join(n.encode("utf-8", "surrogateescape") for n in names) + b"\0",
        )
        out: dict[str, str] = {}
        for rec in ex.stdout().split(b"\0"):
            if len(rec) > 66:
                out[rec[66:].decode("utf-8", "surrogateescape")] = rec[:64].decode()
        return out


def _unrepresentable(name: str) -> tuple[str, str] | None:
    """Where a listed path leaves what the image can hold (a bad name, too deep): the
    path up to there and why; None when all of it is representable."""
    parts = name.split("/")
    for i, part in enumerate(parts):
        if i >= MAX_SCAN_DEPTH:
            return "/".join(parts[:MAX_SCAN_DEPTH]), f"deeper than {MAX_SCAN_DEPTH} levels"
        why = name_problem(part)
        if why is not None:
            return "/".join(parts[: i + 1]), why
    return None


async def wait_http_health(
    port: int,
    timeout: float,
    *,
    interval: float = 0.02,
    give_up: Callable[[], str | None] | None = None,
) -> float:
    """Poll a daemon's ``GET /health`` on loopback until it answers 2xx; return the seconds
    waited. Cheap (no SDK, no token). Only an HTTP answer counts: a port forward may accept
    the connection while nothing listens behind it. ``give_up`` returns a reason to stop
    at once (the machine behind the port died)."""
    t0 = time.monotonic()
    req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    last: object = "no answer"
    while time.monotonic() - t0 < timeout:
        if give_up is not None and (why := give_up()) is not None:
            raise SpaceUnavailableError(why)
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
            try:
                w.write(req)
                await w.drain()
                head = await asyncio.wait_for(r.readline(), 2)
            finally:
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
            if head.startswith(b"HTTP/1.1 2"):
                return time.monotonic() - t0
            last = head.decode(errors="replace").strip() or "empty answer"
        except (TimeoutError, OSError) as e:
            last = e
        await asyncio.sleep(interval)
    raise SpaceUnavailableError(f"cua-spacesd on 127.0.0.1:{port} did not answer: {last}")


def orphan_sweep_script(daemon_pid: str) -> str:
    """A guest shell script that SIGKILLs every process hanging off pid 1 rather than off
    the daemon (``daemon_pid`` is a shell expression giving its pid): what remains of a
    killed daemon's commands and background leftovers of finished ones. The daemon's own
    ``AdvanceEpoch`` only kills the commands it tracks."""
    return (
        f"d=$({daemon_pid})\n"
        + r"""[ -n "$d" ] || exit 3
ps -eo pid=,ppid= | awk -v d="$d" '
  { pp[$1] = $2 }
  END {
    for (p in pp) {
      if (p == 1 || p == d) continue
      q = pp[p]; orphan = 0
      while (q != "" && q != 0) {
        if (q == d) break
        if (q == 1) { orphan = 1; break }
        q = pp[q]
      }
      if (orphan) print p
    }
  }' | xargs -r kill -9 2>/dev/null
exit 0
"""
    )
