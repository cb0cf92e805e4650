"""Mount a power-loss filesystem and drive it: ``mount()`` returns a ``PowerFS`` handle
whose ``cut()`` is a power loss. The handle only talks to the supervisor's socket, so any
process can ``attach()`` to a mount another one made."""

from __future__ import annotations

import contextlib
import ctypes.util
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_spaces.chaos.powerfs.disk import MAX_LATENCY_MS, MAX_STALL_S, seconds
from durable_spaces.chaos.powerfs.powerfs_errors import FuseUnavailableError, PowerFSError
from durable_spaces.chaos.powerfs.supervisor import LOG, SOCKET
from durable_spaces.errors import ConfigError
from durable_spaces.host.bounded import parse_json

_MOUNT_TIMEOUT_S = 120.0
_TEMP_MARK = "temporary"  # in a state dir mount() made itself


def unavailable() -> str | None:
    """Why this machine cannot run powerfs, or None when it can."""
    try:
        if not stat.S_ISCHR(os.stat("/dev/fuse").st_mode):
            return "/dev/fuse is not a character device"
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        return f"/dev/fuse cannot be opened ({e.strerror})"
    if ctypes.util.find_library("fuse3") is None:
        return "libfuse3 is missing (Debian: apt-get install fuse3; images/powerfs/ci-setup.sh)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:
        return f"the mfusepy binding is missing or broken ({e}); pip install mfusepy"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and no fusermount3 (Debian: apt-get install fuse3)"
    return None


@dataclass(frozen=True)
class Tear:
    """A write cut off at a sector boundary: ``kept`` of its ``length`` bytes survived."""

    path: str
    offset: int
    length: int
    kept: int


@dataclass(frozen=True)
class CutReport:
    """What one cut dropped: pending operations, dirty bytes, inodes, and the tears."""

    cut: int
    ops: int
    bytes: int
    inodes: int
    torn: tuple[Tear, ...]
    #: Durability calls a stall was holding (``disk.py``): they failed, their data lost.
    held: int = 0

    @classmethod
    def of(cls, d: dict[str, Any]) -> CutReport:
        return cls(
            int(d["cut"]),
            int(d["ops"]),
            int(d["bytes"]),
            int(d["inodes"]),
            tuple(Tear(**t) for t in d.get("torn", [])),
            int(d.get("held", 0)),
        )


@dataclass(frozen=True)
class DiskState:
    """The disk's timing (``disk.py``): a stall in force, the calls held now (and by
    which processes), the latency, and counters of the current boot."""

    stalled: bool
    stall_left_s: float
    held: int
    held_pids: tuple[int, ...]
    held_paths: tuple[str, ...]
    fsync_ms: float
    stalls: int
    held_calls: int
    delayed_calls: int

    @classmethod
    def of(cls, d: dict[str, Any]) -> DiskState:
        return cls(
            bool(d["stalled"]),
            float(d["stall_left_s"]),
            int(d["held"]),
            tuple(int(p) for p in d["held_pids"]),
            tuple(str(p) for p in d["held_paths"]),
            float(d["fsync_ms"]),
            int(d["stalls"]),
            int(d["held_calls"]),
            int(d["delayed_calls"]),
        )


@dataclass(frozen=True)
class Stats:
    """The current boot's volatile state and counters, and every cut so far."""

    boot: int
    pending_ops: int
    pending_bytes: int
    pending_inodes: int
    writes: int
    fsyncs: int
    fdatasyncs: int
    dir_fsyncs: int
    tree_syncs: int
    open_files: int
    cuts: int
    dropped: tuple[CutReport, ...]

    @classmethod
    def of(cls, d: dict[str, Any]) -> Stats:
        if d.get("server") == "dead":
            raise PowerFSError("the FUSE server of this mount is dead (see powerfs.log)")
        fields = {k: int(d[k]) for k in cls.__dataclass_fields__ if k != "dropped"}
        return cls(**fields, dropped=tuple(CutReport.of(c) for c in d["dropped"]))


def _call(state_dir: str, msg: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    path = os.path.join(state_dir, SOCKET)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(json.dumps(msg).encode() + b"\n")
            line = s.makefile("rb").readline()
    except OSError as e:
        raise PowerFSError(f"powerfs at {state_dir} does not answer ({e})") from e
    if not line:
        raise PowerFSError(f"powerfs at {state_dir} closed the connection ({msg['cmd']})")
    reply: dict[str, Any] = parse_json(line, where=f"powerfs at {state_dir}")
    if "error" in reply:
        raise PowerFSError(f"powerfs {msg['cmd']}: {reply['error']}")
    return reply


class PowerFS:
    """A mounted power-loss filesystem."""

    def __init__(
        self,
        state_dir: str,
        *,
        mountpoint: str = "",
        backing: str = "",
        proc: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.mountpoint = mountpoint
        self.backing = backing
        self._proc = proc
        self.pid = int(_call(state_dir, {"cmd": "ping"})["pid"])

    def cut(self, *, tear: bool | None = None) -> CutReport:
        """Power loss: everything volatile is dropped (the last unsynced write of each file
        torn, if ``tear`` or the mount's default says so) and the mountpoint remounted on
        the durable state. Files open across the cut fail with ENOTCONN (a request that was
        in flight: ECONNABORTED); reopen them by path."""
        return CutReport.of(_call(self.state_dir, {"cmd": "cut", "tear": tear}))

    def stats(self) -> Stats:
        return Stats.of(_call(self.state_dir, {"cmd": "stats"}))

    def stall(self, secs: float) -> DiskState:
        """The disk stops completing durability calls (fsync, fdatasync, directory fsync,
        O_SYNC writes) for ``secs`` seconds from now, or until ``resume()``; ``0`` ends a
        stall. Returns at once. A cut ends it too (the held calls fail: see ``disk.py``)."""
        s = seconds(secs, "stall seconds", MAX_STALL_S)
        return DiskState.of(_call(self.state_dir, {"cmd": "stall", "seconds": s}))

    def resume(self, *, keep_stuck: bool = False) -> DiskState:
        """End a stall: the held calls go on; with ``keep_stuck`` only new calls do, the
        held ones staying stuck until the stall's deadline or the next ``resume()``."""
        msg = {"cmd": "resume", "keep_stuck": bool(keep_stuck)}
        return DiskState.of(_call(self.state_dir, msg))

    def fail(self, pids: list[int]) -> DiskState:
        """The calls a stall holds for processes ``pids`` fail now (EIO, nothing synced):
        for a lab that killed those processes and must not wait for the stall to end."""
        return DiskState.of(_call(self.state_dir, {"cmd": "fail", "pids": list(pids)}))

    def latency(self, fsync_ms: float) -> DiskState:
        """Delay every durability call by ``fsync_ms`` (kept across cuts; 0: none)."""
        ms = seconds(fsync_ms, "fsync latency ms", MAX_LATENCY_MS)
        return DiskState.of(_call(self.state_dir, {"cmd": "latency", "ms": ms}))

    def trap(self, **msg: Any) -> dict[str, Any]:
        """The crash points inside the writes (``trap.py``): ``arm=[kind, n]`` with
        ``notify=<fifo>``, ``release="go"|"fail"``, ``trace=True``; returns the counts, the
        operation held now, and the trace when asked."""
        return _call(self.state_dir, {"cmd": "trap", **msg})

    def disk(self) -> DiskState:
        return DiskState.of(_call(self.state_dir, {"cmd": "disk"}))

    def unmount(self, *, sync: bool = True) -> None:
        """Unmount. ``sync`` (a clean unmount) makes everything durable first; without it
        the volatile state is dropped, as by a cut, and the backing dir keeps the durable
        state. Files still open on the mount become stale (ENOTCONN)."""
        _call(self.state_dir, {"cmd": "unmount", "sync": sync})
        if self._proc is not None:
            self._proc.wait(30)
        else:
            for _ in range(300):
                if not _alive(self.pid):
                    break
                time.sleep(0.1)
        if os.path.exists(os.path.join(self.state_dir, _TEMP_MARK)):
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> PowerFS:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(PowerFSError):
            self.unmount()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def attach(state_dir: str | os.PathLike[str]) -> PowerFS:
    """A handle on a mount another process made (by its state directory)."""
    return PowerFS(os.fspath(state_dir))


def _check_dirs(backing: Path, mountpoint: Path) -> None:
    if not backing.is_dir():
        raise ConfigError(f"powerfs backing {backing} is not a directory")
    if not mountpoint.is_dir():
        raise ConfigError(f"powerfs mountpoint {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        raise ConfigError(f"powerfs mountpoint {mountpoint} is already a mount point")
    if any(mountpoint.iterdir()):
        raise ConfigError(f"powerfs mountpoint {mountpoint} is not empty")
    if backing == mountpoint or backing in mountpoint.parents or mountpoint in backing.parents:
        raise ConfigError(f"powerfs backing {backing} and mountpoint {mountpoint} overlap")


def mount(
    backing: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str],
    *,
    seed: int | str = 0,
    tear: bool = False,
    state_dir: str | os.PathLike[str] | None = None,
) -> PowerFS:
    """Mount ``backing`` (the durable image) at ``mountpoint``; see the package docstring
    for what is volatile. ``seed`` draws the tears (``tear``: by default on every cut)."""
    why = unavailable()
    if why is not None:
        raise FuseUnavailableError(why)
    b, m = Path(backing).resolve(), Path(mountpoint).resolve()
    _check_dirs(b, m)
    if not isinstance(seed, int | str) or isinstance(seed, bool):
        raise ConfigError(f"powerfs seed must be an int or a str, not {seed!r}")
    if state_dir is None:  # a temp dir of ours: whoever unmounts removes it
        sd = Path(tempfile.mkdtemp(prefix="powerfs-"))
        (sd / _TEMP_MARK).touch()
    else:
        sd = Path(state_dir)
        sd.mkdir(mode=0o700, parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "durable_spaces.chaos.powerfs",
        "supervise",
        "--backing",
        str(b),
        "--mountpoint",
        str(m),
        "--state-dir",
        str(sd),
        "--seed",
        str(seed),
    ] + (["--tear"] if tear else [])
    with open(sd / LOG, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, cwd="/"
        )
    deadline = time.monotonic() + _MOUNT_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (sd / LOG).read_text(errors="replace")[-2000:]
            raise PowerFSError(f"powerfs did not mount {m}:\n{tail}")
        if (sd / SOCKET).exists():
            with contextlib.suppress(PowerFSError):
                return PowerFS(str(sd), mountpoint=str(m), backing=str(b), proc=proc)
        time.sleep(0.05)
    proc.terminate()  # the supervisor detaches whatever it mounted
    proc.wait()
    raise PowerFSError(f"powerfs did not mount {m} within {_MOUNT_TIMEOUT_S:.0f}s")
