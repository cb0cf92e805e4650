"""The long-lived process behind a mount: it boots FUSE servers, cuts their power, and
answers the API on a unix socket.

It runs in its own session (``mount()`` starts it with ``start_new_session``), so killing
the "host"'s processes, or the process that mounted, leaves the mount alone. A cut ends
the current server (which aborts its FUSE connection: every request in flight or to come
on the old mount fails), detaches the dead mount, and boots a new server on the same
mountpoint from the durable image.

Protocol: one connection per request, one JSON object per line each way. Requests:
``{"cmd": "ping"}``, ``{"cmd": "stats"}``, ``{"cmd": "cut", "tear": bool | null}``,
``{"cmd": "unmount", "sync": bool}``, and the disk's timing (``disk.py``):
``{"cmd": "stall", "seconds": s}``, ``{"cmd": "resume", "keep_stuck": bool}``,
``{"cmd": "fail", "pids": [...]}``, ``{"cmd": "latency", "ms": ms}`` (kept across cuts:
set again on every boot),
``{"cmd": "disk"}``, and the crash points inside the writes (``trap.py``):
``{"cmd": "trap", "arm": [kind, n], "notify": fifo}``, ``{"cmd": "trap", "release": "go"}``
(or ``"fail"``), ``{"cmd": "trap", "trace": true}``. A reply with an ``"error"`` key is a
failure.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from types import FrameType
from typing import Any

from durable_spaces.chaos.powerfs.image import AREA
from durable_spaces.host.bounded import parse_json

_MNT_DETACH = 2
_BOOT_TIMEOUT_S = 120.0  # laying out the live tree copies the whole image
_CALL_TIMEOUT_S = 120.0
_libc = ctypes.CDLL(None, use_errno=True)

SOCKET = "ctl.sock"
LOG = "powerfs.log"


def umount(mountpoint: str, *, lazy: bool) -> None:
    """umount2(2); a path that is not (or no longer) a mount point is fine."""
    if _libc.umount2(os.fsencode(mountpoint), _MNT_DETACH if lazy else 0):
        e = ctypes.get_errno()
        if e != errno.EINVAL:
            raise OSError(e, f"umount {mountpoint}: {os.strerror(e)}")


class _BootError(Exception):
    pass


class PowerfsSupervisor:
    def __init__(
        self, backing: str, mountpoint: str, state_dir: str, seed: int | str, tear: bool
    ) -> None:
        self.backing, self.mountpoint, self.state_dir = backing, mountpoint, state_dir
        self.live = os.path.join(state_dir, "live")
        self.seed, self.tear = seed, tear
        self.boot = -1
        self.fsync_ms = 0.0  # the disk's latency (disk.py): every boot gets it
        self.cuts: list[dict[str, Any]] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.chan: socket.socket | None = None
        self._rfile: Any = None

    # --- the server of one boot ------------------------------------------------------

    def start(self) -> None:
        """Boot a server and wait until the kernel has initialized the mount."""
        self.boot += 1
        ours, theirs = socket.socketpair()
        log = open(os.path.join(self.state_dir, LOG), "ab")  # noqa: SIM115 (the child's)
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "durable_spaces.chaos.powerfs",
                    "serve",
                    "--backing",
                    self.backing,
                    "--live",
                    self.live,
                    "--mountpoint",
                    self.mountpoint,
                    "--ctl-fd",
                    str(theirs.fileno()),
                    "--boot",
                    str(self.boot),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd="/",
            )
        finally:
            log.close()
            theirs.close()
        self.chan, self._rfile = ours, ours.makefile("rb")
        ours.settimeout(_BOOT_TIMEOUT_S)
        try:
            reply = self._recv()
        except (OSError, ValueError) as e:
            raise _BootError(f"boot {self.boot} did not come up: {e}") from e
        if not reply.get("ready"):
            raise _BootError(f"boot {self.boot} did not come up: {reply}")
        ours.settimeout(_CALL_TIMEOUT_S)
        if self.fsync_ms:
            self._call({"cmd": "latency", "ms": self.fsync_ms})

    def _recv(self) -> dict[str, Any]:
        line = self._rfile.readline()
        if not line:
            raise OSError(errno.EPIPE, "the FUSE server exited (see powerfs.log)")
        reply: dict[str, Any] = parse_json(line, where="the FUSE server's reply")
        return reply

    def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.chan is not None
        self.chan.sendall(json.dumps(msg).encode() + b"\n")
        return self._recv()

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _stop(self, *, kill: bool) -> None:
        """Wait for (or kill) the server, then drop the channel."""
        if self.proc is not None:
            if kill and self.proc.poll() is None:
                self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.chan is not None:
            self._rfile.close()
            self.chan.close()
            self.chan = None

    # --- requests --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        current = self._call({"cmd": "stats"}) if self._alive() else {"server": "dead"}
        return {
            **current,
            "cuts": len(self.cuts),
            "dropped": self.cuts,
            "seed": self.seed,
            "tear": self.tear,
        }

    def cut(self, tear: bool | None) -> dict[str, Any]:
        n = len(self.cuts) + 1
        report: dict[str, Any] = {"cut": n, "ops": 0, "bytes": 0, "inodes": 0, "torn": []}
        if self._alive():
            try:
                report = self._call(
                    {
                        "cmd": "cut",
                        "seed": self.seed,
                        "cut": n,
                        "tear": self.tear if tear is None else tear,
                    }
                )
            except (OSError, ValueError):
                report["server"] = "died during the cut"
        self._stop(kill=True)  # it exits by itself after the reply; a kill is the same cut
        umount(self.mountpoint, lazy=True)  # the dead connection; open fds stay dead
        self.cuts.append(report)
        self.start()
        return report

    def disk(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The disk's timing (``disk.py``), asked of the current boot's server."""
        if not self._alive():
            return {"error": "the FUSE server of this mount is dead (see powerfs.log)"}
        reply = self._call(msg)
        if msg["cmd"] == "latency" and "error" not in reply:
            self.fsync_ms = float(reply["fsync_ms"])
        return reply

    def unmount(self, sync: bool) -> None:
        if sync and self._alive():
            self._call({"cmd": "sync"})
        try:
            umount(self.mountpoint, lazy=not sync)
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            sync = False  # files still open: detach, and the server dies with the rest
            umount(self.mountpoint, lazy=True)
        self._stop(kill=not sync)
        shutil.rmtree(os.path.join(self.backing, AREA), ignore_errors=True)
        shutil.rmtree(self.live, ignore_errors=True)
        shutil.rmtree(self.live + ".hidden", ignore_errors=True)

    # --- the socket ------------------------------------------------------------------

    def serve(self) -> None:
        path = os.path.join(self.state_dir, SOCKET)
        if os.path.exists(path):
            os.unlink(path)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        os.chmod(path, 0o600)
        srv.listen(8)
        while True:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(_CALL_TIMEOUT_S)
                try:
                    line = conn.makefile("rb").readline()
                    msg = parse_json(line or b"{}", where="a request")
                    reply, done = self._handle(msg)
                except Exception as e:  # any failure goes back to the caller, typed there
                    reply, done = {"error": f"{type(e).__name__}: {e}"}, False
                with contextlib.suppress(OSError):  # the caller gave up waiting
                    conn.sendall(json.dumps(reply).encode() + b"\n")
            if done:
                srv.close()
                os.unlink(path)
                return

    def _handle(self, msg: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        cmd = msg.get("cmd")
        if cmd == "ping":
            return {"ok": True, "boot": self.boot, "pid": os.getpid()}, False
        if cmd == "stats":
            return self.stats(), False
        if cmd == "cut":
            return self.cut(msg.get("tear")), False
        if cmd in ("stall", "resume", "fail", "latency", "disk", "trap"):
            return self.disk(msg), False
        if cmd == "unmount":
            self.unmount(bool(msg.get("sync", True)))
            return {"ok": True}, True
        return {"error": f"unknown command {cmd!r}"}, False


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="powerfs supervise")
    ap.add_argument("--backing", required=True)
    ap.add_argument("--mountpoint", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--seed", default="0")
    ap.add_argument("--tear", action="store_true")
    args = ap.parse_args(argv)
    seed: int | str = int(args.seed) if args.seed.lstrip("-").isdigit() else args.seed
    sup = PowerfsSupervisor(args.backing, args.mountpoint, args.state_dir, seed, args.tear)
    signal.signal(signal.SIGTERM, _terminate)  # SIGTERM: power off (volatile state lost)
    done = False
    try:
        sup.start()
        sup.serve()
        done = True
    except _BootError as e:
        print(f"powerfs: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        if not done:
            sup.unmount(sync=False)
