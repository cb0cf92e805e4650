"""The connection of one Space to its cua-spacesd daemon, through the ``cua`` SDK.

The SDK client is made on the first call (after the probe says the Space still exists)
and kept until ``drop``: a backend drops it when the daemon restarted or its token
changed, and the next call connects again. Every SDK error is mapped to the Space's own
(``errormap``). With a ``user``, the daemon's file operations run as that user too, as
its commands do.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

from durable_spaces.backends.spacesd.errormap import DaemonProbe, ErrorMap
from durable_spaces.backends.spacesd.runtime import runtime
from durable_spaces.errors import SpaceGoneError
from durable_spaces.host.bounded import parse_json

#: Daemon file operations that take ``user=`` (``upload`` takes it in its options).
_FILE_OPS = frozenset({"download", "make_dir", "remove", "stat", "list_dir", "move_path"})


class DaemonConnection:
    """The SDK client of Space ``name``'s daemon at ``url`` (module doc)."""

    def __init__(
        self,
        name: str,
        url: str,
        token: str,
        probe: DaemonProbe,
        errors: ErrorMap,
        user: str | None,
        sdk_home: str | None,
    ) -> None:
        self.name = name
        self.url = url
        self._token = token
        self._probe = probe
        self._errors = errors
        self._user = user
        #: The SDK's own state (its sandbox registry): kept out of the user's ~/.cua.
        self._sdk_home = sdk_home
        self._client: Any = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:  # never shows the token
        return f"DaemonConnection({self.name!r}, {self.url!r})"

    def drop(self) -> None:
        """Forget the client: the next call connects again."""
        self._client = None

    async def _connected(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    if self._probe.gone():
                        raise SpaceGoneError(f"Space {self.name!r} no longer exists")
                    try:
                        sb = (
                            await runtime(self._sdk_home)
                            .sandboxes()
                            .connect_url(self.url, self._token, f"ds-{self.name}")
                        )
                        self._client = await sb.spacesd(None)
                    except Exception as e:
                        raise self._errors.map(e) from None
        return self._client

    async def call(self, method: str, *args: Any, **kw: Any) -> Any:
        """SDK ``method`` of the daemon, its errors mapped. With a ``user``, the file
        operations run as that user too, like the commands."""
        if self._user is not None:
            if method in _FILE_OPS:
                kw.setdefault("user", self._user)
            elif method == "upload" and len(args) >= 3 and args[2] is not None:
                args[2].user = self._user
        client = await self._connected()
        try:
            return await getattr(client, method)(*args, **kw)
        except Exception as e:
            raise self._errors.map(e) from None

    async def rpc(self, method: str, req: Mapping[str, Any]) -> dict[str, Any]:
        """``ProcessService/<method>`` of the daemon, JSON in and out."""
        out = await self.call("call_json", f"ProcessService/{method}", json.dumps(req))
        return dict(parse_json(out or "{}", where=f"the daemon's answer to {method}"))
