"""One boot of the mount: the FUSE server process, from power-on to the next cut.

It lays the live tree out as a copy of the durable image (the backing directory), indexes
the image, mounts, and answers its supervisor on an inherited socket. Its memory and the
live tree hold all volatile state, so a cut is this process ending (after the optional
tears); the next boot starts from the image alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import threading
from typing import Any

from durable_spaces.chaos.powerfs.binding import PowerFUSE
from durable_spaces.chaos.powerfs.cut import power_cut
from durable_spaces.chaos.powerfs.disk import Disk
from durable_spaces.chaos.powerfs.image import AREA, Image
from durable_spaces.chaos.powerfs.ops import PowerOps
from durable_spaces.chaos.powerfs.volatile import Volatile
from durable_spaces.errors import ConfigError
from durable_spaces.host.bounded import parse_json


def lay_out(backing: str, live: str) -> None:
    """Orphans of the last boot are garbage (fsck reclaims them); the live tree starts as
    a copy of the durable image (``cp -a`` keeps hard links, modes, owners, times)."""
    shutil.rmtree(os.path.join(backing, AREA), ignore_errors=True)
    shutil.rmtree(live, ignore_errors=True)
    shutil.rmtree(live + ".hidden", ignore_errors=True)  # ops.PowerOps: unlinked open files
    os.mkdir(live, 0o700)
    subprocess.run(
        ["cp", "-a", "--reflink=auto", "--", os.path.join(backing, "."), live],
        check=True,
        stdin=subprocess.DEVNULL,
    )


def sync_all(ops: PowerOps) -> None:
    """Make the whole live state durable (a clean unmount): every directory's entries,
    then every file with anything pending."""
    with ops.mutex:
        for ino in ops.image.sync_tree(ops.live):
            ops.volatile.synced_dir(ino, with_meta=True)
        pending = {ino for ino, _ in ops.volatile.items()}
        for dirpath, _, files in os.walk(ops.live):
            for name in files:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                if st.st_ino not in pending or not stat.S_ISREG(st.st_mode):
                    continue
                fd = os.open(path, os.O_RDONLY)
                try:
                    ops.sync_data(st.st_ino, fd, meta=True)
                finally:
                    os.close(fd)


_DISK = ("stall", "resume", "fail", "latency", "disk")


def _disk(disk: Disk, msg: dict[str, Any]) -> dict[str, Any]:
    """A request about the disk's timing; no mutation lock (a stall never holds it)."""
    try:
        if msg["cmd"] == "stall":
            return disk.stall(msg.get("seconds"))
        if msg["cmd"] == "resume":
            return disk.resume(keep_stuck=bool(msg.get("keep_stuck")))
        if msg["cmd"] == "latency":
            return disk.latency(msg.get("ms"))
        if msg["cmd"] == "fail":
            return disk.fail(msg.get("pids"))
        return disk.state()
    except ConfigError as e:
        return {"error": str(e)}


class _Control:
    """The supervisor's channel: one JSON object per line each way."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.rfile = self.sock.makefile("rb")
        self._send_lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        with self._send_lock:
            self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def serve(self, ops: PowerOps, boot: int) -> None:
        for line in self.rfile:
            msg = parse_json(line, where="the supervisor's message")
            cmd = msg.get("cmd")
            if cmd == "stats":
                with ops.mutex:
                    stats = {
                        "boot": boot,
                        **ops.volatile.totals(),
                        **ops.counters,
                        "open_files": len(ops.files),
                    }
                self.send(stats)
            elif cmd == "cut":
                ops.mutex.acquire()  # never released: every mutation waits until we are gone
                held = ops.disk.state()["held"]  # held by a stall (disk.py): they fail
                seed, tear, n = msg["seed"], bool(msg["tear"]), int(msg["cut"])
                report = power_cut(ops, seed=seed, tear=tear, cut=n)
                self.send({**report, "held": held})
                os._exit(0)
            elif cmd in _DISK:
                self.send(_disk(ops.disk, msg))
            elif cmd == "trap":  # no mutation lock: a held operation waits outside it
                try:
                    self.send(ops.trap.command(msg))
                except ConfigError as e:
                    self.send({"error": str(e)})
            elif cmd == "sync":
                sync_all(ops)
                self.send({"ok": True})
            else:
                self.send({"error": f"unknown command {cmd!r}"})
        os._exit(3)  # the supervisor is gone: nobody can cut or unmount us; power off


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="powerfs serve")
    ap.add_argument("--backing", required=True)
    ap.add_argument("--live", required=True)
    ap.add_argument("--mountpoint", required=True)
    ap.add_argument("--ctl-fd", type=int, required=True)
    ap.add_argument("--boot", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="powerfs[%(process)d] %(message)s")
    os.umask(0)  # modes arrive with the caller's umask applied by the kernel
    control = _Control(args.ctl_fd)
    lay_out(args.backing, args.live)
    image = Image(args.backing)
    image.scan(args.live)
    ops = PowerOps(args.live, image, Volatile(), on_ready=lambda: control.send({"ready": True}))
    threading.Thread(target=control.serve, args=(ops, args.boot), daemon=True).start()
    PowerFUSE(
        ops,
        args.mountpoint,
        foreground=True,
        allow_other=True,
        default_permissions=True,
        use_ino=True,
        fsname="powerfs",
        subtype="powerfs",
    )
