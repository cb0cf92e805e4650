"""Docker Spaces: how long the machinery takes (``python -m bench.docker``).

Figures: container create -> daemon's first answer; restart (kill + start) -> first
answer, idle and with a reader holding an output stream (where ``docker restart`` would
wait out the daemon's grace); daemon kill -> new daemon answering; a workspace
checkpoint (``tar -cf -`` on stdout through the daemon) and restore (tar on stdin, or
upload, then ``tar -x``) of 500 files of 4 KiB; and a trivial keyed exec on docker
against the same call on the ``local`` backend.
Skips with the reason when Docker or the image is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("CUA_TELEMETRY", "0")

ROUNDS = 5
FILES, FILE_SIZE = 500, 4096


async def _timed(fn: Callable[[], Awaitable[Any]], n: int = ROUNDS) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


def _fmt(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1000:7.1f} ms  (min {min(xs) * 1000:.1f}, n={len(xs)})"


async def _trivial_exec(space: Any, tag: str, n: int) -> list[float]:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        res = await space.exec(["true"], key=f"bench:{tag}:{i}@1", epoch=1)
        times.append(time.perf_counter() - t0)
        assert res.exit_code == 0, res
    return times


async def main() -> int:
    from durable_spaces.backends.docker import backend as dk

    reason = dk.unavailable_reason()
    if reason is not None:
        print(f"SKIP bench.docker: {reason}")
        return 0
    tmp = tempfile.mkdtemp(prefix="bench-docker-")
    backend = dk.DockerBackend(os.path.join(tmp, "state"))
    tag = uuid.uuid4().hex[:6]
    print(f"image {backend.image}")
    try:
        # create -> first answer (each a new container), then removal
        names = [f"bench-{tag}-{i}" for i in range(ROUNDS)]
        creates, removes = [], []
        for n in names:
            t0 = time.perf_counter()
            await backend.create(n)
            creates.append(time.perf_counter() - t0)
        for n in names[1:]:
            t0 = time.perf_counter()
            await backend.delete(n)
            removes.append(time.perf_counter() - t0)
        print(f"create -> first answer      {_fmt(creates)}")
        print(f"delete (rm -f)              {_fmt(removes)}")

        name = names[0]
        space = await backend.create(name)
        restarts = await _timed(lambda: backend.restart(name))
        print(f"restart -> first answer     {_fmt(restarts)}")

        async def restart_streaming() -> None:
            """Restart while a reader holds a command's output stream (no detach)."""
            ex = await space.spawn(
                ["bash", "-c", "while :; do echo x; sleep 0.05; done"], key=None, epoch=0
            )

            async def read() -> None:
                async for _ in ex.output():
                    pass

            reader = asyncio.create_task(read())
            await asyncio.sleep(0.2)
            t0 = time.perf_counter()
            await backend.restart(name)
            held.append(time.perf_counter() - t0)
            # The stream breaks with SpaceUnavailableError, as it must.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader, 10)

        held: list[float] = []
        await _timed(restart_streaming)
        print(f"restart, stream held        {_fmt(held)}")
        kills = await _timed(lambda: backend.kill_daemon(name))
        print(f"daemon kill -> new daemon   {_fmt(kills)}")

        # 500 files of 4 KiB, then checkpoint (tar to stdout) and restore (tar on stdin).
        mk = (
            f"mkdir -p data && for i in $(seq 1 {FILES}); do "
            f"head -c {FILE_SIZE} /dev/urandom > data/f$i; done"
        )
        assert (await space.exec(["bash", "-c", mk], key=None, epoch=0)).exit_code == 0
        tars: list[bytes] = []

        async def checkpoint() -> None:
            ex = await space.spawn(["tar", "-cf", "-", "."], key=None, epoch=0)
            res = await ex.wait()
            assert res.exit_code == 0
            tars.append(ex.stdout())

        cks = await _timed(checkpoint)
        blob = tars[-1]

        async def restore() -> None:
            await space.exec(
                ["bash", "-c", "find . -mindepth 1 -delete && tar -xf -"],
                key=None,
                epoch=0,
                stdin=blob,
            )

        rss = await _timed(restore)
        table = await space.scan()
        assert len(table) == FILES, len(table)

        async def restore_upload() -> None:
            await space.write_file(".ckpt.tar", blob, epoch=1)
            res = await space.exec(
                [
                    "bash",
                    "-c",
                    "find . -mindepth 1 ! -name .ckpt.tar -delete && "
                    "tar -xf .ckpt.tar && rm .ckpt.tar",
                ],
                key=None,
                epoch=0,
            )
            assert res.exit_code == 0, res

        rsu = await _timed(restore_upload)
        print(f"checkpoint {FILES}x4KiB (tar)  {_fmt(cks)}  ({len(blob) / 1e6:.1f} MB)")
        print(f"restore (stdin + tar -x)    {_fmt(rss)}")
        print(f"restore (upload + tar -x)   {_fmt(rsu)}")

        d_exec = await _trivial_exec(space, f"d{tag}", 30)
        print(f"trivial exec on docker      {_fmt(d_exec)}")
    finally:
        await backend.delete_all()
        await backend.close()

    from durable_spaces.backends import open_backend, unavailable_reason

    lr = unavailable_reason("local")
    if lr is not None:
        print(f"trivial exec on local       skipped: {lr}")
        return 0
    local = open_backend("local", os.path.join(tmp, "local"))
    try:
        ls = await local.create(f"bench-{tag}")
        l_exec = await _trivial_exec(ls, f"l{tag}", 30)
        print(f"trivial exec on local       {_fmt(l_exec)}")
        ratio = statistics.median(d_exec) / statistics.median(l_exec)
        print(f"docker / local (trivial exec, medians): {ratio:.2f}x")
    finally:
        await local.delete(f"bench-{tag}")
        await local.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
