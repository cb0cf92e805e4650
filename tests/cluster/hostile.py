"""Hostile clients of a host API, in a process of their own (so the server under test is
measured, not this process's GIL): each slot holds one connection of its kind open and
opens another as soon as the server cuts it. Prints ``ready`` once every slot has had a
connection, then one line per second ``open=N opened=M``; runs until SIGTERM.

    python hostile.py HOST:PORT --kinds silent:30,garbage:30,hello:20,member:20
        --sources 127.0.0.2,127.0.0.3 [--member-tls DIR]

Kinds:

- ``silent``: TCP, then nothing (a TLS handshake that never starts);
- ``garbage``: the request that took the old server down, ``POST`` with a body promised and
  never sent, in plain text (not TLS);
- ``hello``: a TLS ClientHello, then nothing (a handshake that never ends);
- ``header``/``body``: a cluster member's certificate (``--member-tls``), a completed
  handshake, then half a request's headers, or whole headers and a body never sent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import ssl
from pathlib import Path

from durable_spaces.cluster.tls import Trust

#: A slot cut at once waits this long before it connects again (a reconnect storm would
#: measure the test machine's CPU, not the server).
RECONNECT_SECS = 0.1


def _hello() -> bytes:
    """The bytes of a TLS 1.3 ClientHello (the handshake's first flight)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="h1.host.ds-cluster.internal")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


class Slots:
    def __init__(self, host: str, port: int, member: ssl.SSLContext | None) -> None:
        self.host, self.port, self.member = host, port, member
        self.open = 0
        self.opened = 0
        self.started: set[int] = set()
        self.hello = _hello()

    async def one(self, slot: int, kind: str, source: str) -> None:
        while True:
            with contextlib.suppress(OSError, ssl.SSLError, asyncio.IncompleteReadError):
                await self._hold(slot, kind, source)
            await asyncio.sleep(RECONNECT_SECS)

    async def _hold(self, slot: int, kind: str, source: str) -> None:
        tls = kind in ("header", "body")
        reader, writer = await asyncio.open_connection(
            self.host,
            self.port,
            local_addr=(source, 0),
            ssl=self.member if tls else None,
            server_hostname="h1.host.ds-cluster.internal" if tls else None,
        )
        self.open += 1
        self.opened += 1
        self.started.add(slot)
        try:
            if kind == "garbage":
                writer.write(b"POST /v1/place HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
            elif kind == "hello":
                writer.write(self.hello)
            elif kind == "header":
                writer.write(b"GET /v1/hosts/h1/spaces/sp?generation=1 HTTP/1.1\r\nHost: x\r\n")
            elif kind == "body":
                writer.write(
                    b"POST /v1/hosts/h1/place HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                )
            await writer.drain()
            while await reader.read(65536):  # whatever it says, until it cuts us
                pass
        finally:
            self.open -= 1
            writer.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("--kinds", required=True)
    ap.add_argument("--sources", required=True)
    ap.add_argument("--member-tls", type=Path)
    args = ap.parse_args()
    host, _, port = args.address.rpartition(":")
    member = None
    if args.member_tls is not None:
        member = Trust(args.member_tls)
        member.set_crl(Path(args.member_tls, "crl.pem").read_text())
    slots = Slots(host, int(port), member.client_context() if member else None)
    sources = args.sources.split(",")
    tasks = []
    n = 0
    for part in args.kinds.split(","):
        kind, _, count = part.partition(":")
        for _ in range(int(count)):
            tasks.append(asyncio.create_task(slots.one(n, kind, sources[n % len(sources)])))
            n += 1
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while len(slots.started) < n and not stop.is_set():
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    while not stop.is_set():
        print(f"open={slots.open} opened={slots.opened}", flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    for t in tasks:
        t.cancel()


if __name__ == "__main__":
    asyncio.run(main())
