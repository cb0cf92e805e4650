"""The workspaces ``bench.adapter`` measures on, and the peers it compares the adapter to.

A tree is ``n`` files of 4 KiB of seeded random bytes in 10 directories, the same bytes
in every Space of a run (so the wrapped call's Space and the unwrapped call's own Space
are identical). A call changes ``CHANGED`` of its files, a different ten each time.

Peers are what a user could run instead of the adapter to keep the same tree: ``git add
-A && git commit``, ``tar -cf`` (the archive written to a file beside the tree, as a
checkpoint would), ``find | sha256sum`` (hash everything) and a stat-only walk. Each runs
inside the Space through one exec, as the adapter's own work does, after the same change
of ten files (not timed); the median over repetitions is printed as ``PEER`` lines.
"""

from __future__ import annotations

import io
import random
import shlex
import statistics
import tarfile
import time

from durable_spaces.space import Space

FILE_SIZE = 4096
CHANGED = 10
DIRS = 10

#: name -> the shell command timed (run in the workspace).
PEERS = {
    "git-commit": "git add -A && git -c user.name=b -c user.email=b@b commit -q -m c",
    "tar-cf": "tar -cf ../.bench-peer.tar .",
    "find-sha256sum": "find . -type f -print0 | xargs -0 sha256sum > /dev/null",
    "stat-walk": "find . -printf '%s %T@ %p\\n' > /dev/null",
}
GIT_INIT = "git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -q -m init"


def path(i: int) -> str:
    return f"src/d{i % DIRS}/f{i:04d}"


def tree_tar(files: int, seed: int = 13) -> bytes:
    """The tree as a tar (the same bytes for the same arguments)."""
    rng = random.Random(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for i in range(files):
            data = rng.randbytes(FILE_SIZE)
            info = tarfile.TarInfo(path(i))
            info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def populate(space: Space, data: bytes, epoch: int) -> None:
    res = await space.exec(["tar", "-xf", "-"], key=None, epoch=epoch, cwd=space.root, stdin=data)
    if res.exit_code != 0:
        raise RuntimeError(f"populating {space.name} failed: {res.output[-300:]!r}")


def change_command(files: int, call: int, tag: str) -> str:
    """Shell: append a line to ``CHANGED`` files of the tree (a different set per call)."""
    k = min(CHANGED, files)
    paths = " ".join(shlex.quote(path((call * k + j) % files)) for j in range(k))
    return f"for f in {paths}; do printf '%s\\n' {shlex.quote(tag)} >> \"$f\"; done"


async def sh(space: Space, script: str, epoch: int) -> tuple[int | None, bytes]:
    res = await space.exec(["bash", "-c", script], key=None, epoch=epoch, cwd=space.root)
    return res.exit_code, res.output


async def peers(space: Space, files: int, reps: int, epoch: int) -> dict[str, float | str]:
    """Median ms per peer on ``space``'s tree, or why a peer could not run there."""
    out: dict[str, float | str] = {}
    code, text = await sh(space, GIT_INIT, epoch)
    git_ok = code == 0
    for name, cmd in PEERS.items():
        if name == "git-commit" and not git_ok:
            out[name] = f"git unusable in the Space ({text[-120:].decode(errors='replace')!r})"
            continue
        xs: list[float] = []
        for i in range(reps):
            await sh(space, change_command(files, 1000 + i, f"peer-{name}-{i}"), epoch)
            t0 = time.perf_counter()
            code, text = await sh(space, cmd, epoch)
            xs.append(time.perf_counter() - t0)
            if code != 0:
                out[name] = f"exit {code}: {text[-120:].decode(errors='replace')!r}"
                break
        else:
            out[name] = statistics.median(xs) * 1000
    await sh(space, "rm -rf .git ../.bench-peer.tar", epoch)
    return out
