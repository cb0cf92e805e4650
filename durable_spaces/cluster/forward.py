"""A TCP port forward from the host's address to a Space's loopback port.

Docker publishes a Space's daemon on the machine's loopback only (``docker.py``); a host
agent that provides docker Spaces to other machines forwards one port of its own address
per Space to it, as the reference's host service does. The target is looked up for each
new connection (a restarted container may come back on another port), and connections
already open are cut when the forward closes. Bytes are copied as they come: gRPC over
HTTP/2 passes through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class PortForward:
    """Listens on ``host:port`` (0: any free port) and forwards to ``127.0.0.1:target()``
    (``target`` returns None while the Space has no port: the connection is refused)."""

    def __init__(self, host: str, target: Callable[[], int | None]) -> None:
        self.host = host
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.target()
        if target is None:
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        self._open |= {writer, up_w}
        try:
            await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
        finally:
            self._open -= {writer, up_w}

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._open):
                with contextlib.suppress(Exception):
                    w.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
