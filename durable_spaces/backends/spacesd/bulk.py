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

import io
import tarfile
from collections.abc import Sequence

from durable_spaces.errors import SpaceError
from durable_spaces.space import confine, name_problem

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
