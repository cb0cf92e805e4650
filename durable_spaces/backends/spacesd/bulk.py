"""Reading many files of a daemon-backed Space in one transfer: one command that checks
each path and streams the files as one ``tar``, read back member by member in memory.

Why: ``read_file`` costs a ``stat`` per path component and a download, each a daemon
round trip; a call that changed ten files paid forty. One ``tar`` costs one command.

Path safety, as ``read_file`` and ``MUTATE``: the script walks each path's components
and leaves out any path with a symlink on the way or at its end, or whose end is not a
regular file (the same window between check and read as theirs, which the daemon has no
``openat``-style API to close). Nothing is ever extracted to disk: each member must be
a regular file named exactly as one of the paths asked for: a member not asked for
refuses the whole stream (``SpaceError``); one asked for that is no longer a regular
file (a command replaced it by a symlink after the check) is left out. A stream whose
``tar`` did not exit 0 (a file changed or vanished while it was read) yields nothing:
the caller reads those paths one by one.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Awaitable, Callable, Sequence

from durable_spaces.errors import SpaceError
from durable_spaces.space import PathTable, confine, name_problem

#: Stale files smaller than this are read whole by a scan and hashed here (``hash_stale``),
#: at most ``KEEP_TOTAL`` bytes of them a scan; larger ones are hashed in the Space.
KEEP_MAX = 64 * 1024
KEEP_TOTAL = 8 << 20

#: Run as ``bash -c READ ds-read <root>`` with the paths on stdin, NUL-separated.
READ = r"""
cd -P -- "$1" || exit 90
while IFS= read -r -d '' p; do
  q=$p
  while :; do
    [[ -L $q ]] && continue 2
    [[ $q == */* ]] || break
    q=${q%/*}
  done
  [[ -f $p ]] && printf "%s\0" "$p"
done | tar -c -f - --format=gnu --hard-dereference --no-recursion --null --verbatim-files-from -T -
"""


def wanted(root: str, paths: Sequence[str]) -> dict[str, str]:
    """Each asked path -> its workspace-relative form (an escape raises, as
    ``read_file``'s does); names the image cannot hold are not asked for."""
    rels: dict[str, str] = {}
    for p in paths:
        rel = confine(root, p)
        if rel != "." and not any(name_problem(c) for c in rel.split("/")):
            rels[p] = rel
    return rels


def answer(wanted: dict[str, str], stream: bytes | None) -> dict[str, bytes]:
    """What ``read_files`` returns from the command's stdout (None: ``tar`` failed, a
    file changed or went while it was read; the caller reads them one by one)."""
    if stream is None:
        return {}
    got = parse(stream, set(wanted.values()))
    return {p: got[rel] for p, rel in wanted.items() if rel in got}


def read_argv(root: str) -> list[str]:
    return ["bash", "-c", READ, "ds-read", root]


def read_input(rels: list[str]) -> bytes:
    return b"".join(r.encode("utf-8", "surrogateescape") + b"\0" for r in rels)


def parse(stream: bytes, wanted: set[str]) -> dict[str, bytes]:
    """The regular-file members of ``stream`` (a tar), each named in ``wanted``."""
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(
            fileobj=io.BytesIO(stream), mode="r:", encoding="utf-8", errors="surrogateescape"
        ) as tar:
            for m in tar:
                if m.name not in wanted:
                    raise SpaceError(
                        f"the Space's file stream holds {m.name!r}, which was not asked "
                        "for: refused"
                    )
                if not m.isreg():
                    continue  # replaced after its check: the caller reads it alone
                f = tar.extractfile(m)
                if f is None:
                    raise SpaceError(f"the Space's file stream has no data for {m.name!r}")
                out[m.name] = f.read()
    except tarfile.TarError as e:
        raise SpaceError(f"the Space's file stream is not a tar archive: {e}") from None
    return out


async def hash_stale(
    stale: list[str],
    table: PathTable,
    tar: Callable[[list[str]], Awaitable[bytes | None]],
    hash_files: Callable[[list[str]], Awaitable[dict[str, str]]],
) -> tuple[dict[str, str], dict[str, bytes]]:
    """The sha256 of each file in ``stale`` (gone ones left out), and the bytes of
    those read whole: the small ones (under ``KEEP_MAX``, ``KEEP_TOTAL`` in all) come
    in one ``tar`` (``tar``: the stream of ``read_argv``, None when it failed) and are
    hashed here, so transactional mode's read of what a command changed is answered
    from them (one command fewer per call); the rest, and any the stream left out or
    could not give (changed while read, no longer a regular file), are hashed in the
    Space by ``hash_files``."""
    hashes: dict[str, str] = {}
    kept: dict[str, bytes] = {}
    small: list[str] = []
    total = 0
    for name in stale:
        size = table[name].size or 0
        if size < KEEP_MAX and total + size <= KEEP_TOTAL:
            small.append(name)
            total += size
    if len(small) > 1:  # one file: hashing it in the Space is one command already
        stream = await tar(small)
        if stream is not None:
            kept = parse(stream, set(small))
            hashes = {n: hashlib.sha256(data).hexdigest() for n, data in kept.items()}
    rest = [n for n in stale if n not in hashes]
    if rest:
        hashes.update(await hash_files(rest))
    return hashes, kept
