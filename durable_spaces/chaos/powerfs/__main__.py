"""``python -m durable_spaces.chaos.powerfs``: mount, cut, stats, unmount, and the disk's
timing (stall, resume, latency, disk); and the two internal entries the supervisor and
the FUSE server run under."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from durable_spaces.chaos.powerfs.powerfs_errors import PowerFSError
from durable_spaces.errors import ConfigError


def _cli(argv: list[str]) -> int:
    from durable_spaces.chaos.powerfs.api import attach, mount

    ap = argparse.ArgumentParser(prog="python -m durable_spaces.chaos.powerfs")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mount", help="mount BACKING at MOUNTPOINT; prints the state dir")
    m.add_argument("backing")
    m.add_argument("mountpoint")
    m.add_argument("--seed", default="0")
    m.add_argument("--tear", action="store_true", help="tear the last unsynced writes on cuts")
    m.add_argument("--state-dir")
    for name, what in (
        ("cut", "power loss, then remount"),
        ("stats", "volatile state"),
        ("unmount", "unmount (a clean one unless --no-sync)"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("state_dir")
        if name == "cut":
            p.add_argument("--tear", action=argparse.BooleanOptionalAction, default=None)
        if name == "unmount":
            p.add_argument("--no-sync", action="store_true", help="drop the volatile state")
    for name, what in (
        ("stall", "hold every durability call for SECONDS (0: end a stall)"),
        ("resume", "end a stall"),
        ("latency", "delay every durability call by MS milliseconds"),
        ("disk", "the disk's timing: stall, held calls, latency"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("state_dir")
        if name in ("stall", "latency"):
            p.add_argument("value", type=float, metavar="SECONDS" if name == "stall" else "MS")
        if name == "resume":
            p.add_argument("--keep-stuck", action="store_true", help="serve only new calls")
    args = ap.parse_args(argv)
    if args.cmd in ("stall", "resume", "latency", "disk"):
        fs = attach(args.state_dir)
        state = (
            fs.stall(args.value)
            if args.cmd == "stall"
            else fs.latency(args.value)
            if args.cmd == "latency"
            else fs.resume(keep_stuck=args.keep_stuck)
            if args.cmd == "resume"
            else fs.disk()
        )
        print(json.dumps(dataclasses.asdict(state)))
        return 0
    if args.cmd == "mount":
        seed: int | str = int(args.seed) if args.seed.lstrip("-").isdigit() else args.seed
        fs = mount(
            args.backing, args.mountpoint, seed=seed, tear=args.tear, state_dir=args.state_dir
        )
        print(json.dumps({"state_dir": fs.state_dir, "mountpoint": fs.mountpoint, "pid": fs.pid}))
    elif args.cmd == "cut":
        print(json.dumps(dataclasses.asdict(attach(args.state_dir).cut(tear=args.tear))))
    elif args.cmd == "stats":
        print(json.dumps(dataclasses.asdict(attach(args.state_dir).stats())))
    else:
        attach(args.state_dir).unmount(sync=not args.no_sync)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["supervise"]:
        from durable_spaces.chaos.powerfs import supervisor

        supervisor.main(argv[1:])
        return 0
    if argv[:1] == ["serve"]:
        from durable_spaces.chaos.powerfs import server

        server.main(argv[1:])
        return 0
    try:
        return _cli(argv)
    except (PowerFSError, ConfigError) as e:
        print(f"powerfs: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
