"""Processes a wrapped command left running in the workspace, and the workspace files
they may change without telling any change journal: read again at every scan while
they live.

Why: a store through a shared writable ``mmap`` raises no inotify event, and while its
page stays dirty it need not move the file's mtime either; the event comes at the last
close (``IN_CLOSE_WRITE``), which a process that outlives its call postpones for as long
as it runs. Neither the host's journal (``backends/local/journal.py``) nor the one in
the Space (``backends/spacesd/guest_journal.pl``) nor a stat key sees such a store, so
a scan's answer is not trusted for the files such a process holds: transactional mode
reads those again itself (``TransactionalKeeper``), at every scan while the process
lives, on every backend alike (one command in the Space, ``look``, or the same look
done here when the Space's processes are this host's: ``space.HostProcesses``).

What ``look`` finds: the processes whose working directory is at or under the workspace
(auto mode's condition to leave transactional mode), and the files under the workspace
they hold open or map shared and writable (as far as the Space's user may read their
``/proc``). On this host (``host_look``) the process running the adapter and its
ancestors are not among them: no call started them, and an agent whose workspace is its
own working directory (an integration's pinned workspace, ``integrations/attempt.py``)
would otherwise leave transactional mode at its first command. What it cannot see: a
process that left the workspace (``cd``) before the look, a file held through a name
outside the workspace (a hard link), and a process the Space's user may not look at.
Every process's mappings would cost a read of every ``maps`` in the Space, which on a
busy host (a ``local`` Space's) is most of a call; ``docs/journal-trust.md`` says the
rest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from durable_spaces.errors import PathEscapeError
from durable_spaces.host.maps import read_whole
from durable_spaces.space import HostProcesses, PathEntry, PathTable, Space, confine

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Leftovers", "host_look", "look", "reread"]

#: One record of the look's output: a pid in the workspace (P), a file one of them
#: holds open (F), a file some process maps shared and writable (M, as ``maps`` prints
#: it: a newline in its name is ``\\012``).
_RECORD = re.compile(rb"\A([PFM])(.*)\Z", re.S)


@dataclass(frozen=True)
class Leftovers:
    """What one look found: pids in the workspace and the workspace paths held."""

    pids: tuple[int, ...] = ()
    held: frozenset[str] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.pids or self.held)

    def note(self, auto: bool) -> str:
        """The line a call that left them adds to its result, for the model."""
        pids = ", ".join(str(p) for p in self.pids[:8]) + (" ..." if len(self.pids) > 8 else "")
        what = f"this command left processes running in the workspace (pids {pids})"
        if auto:
            return f"[note: {what}; the Space is kept by checkpoints from now on]"
        return (
            f"[note: {what}; files they hold are read again at every call while they run, "
            "and what they change between calls is recorded with the next call]"
        )


def _glob_escaped(path: str) -> str:
    return re.sub(r"([][*?\\])", r"\\\1", path)


def script(root: str) -> str:
    """The look (bash and ``find``, which transactional mode needs anyway): NUL-ended
    records, ``_RECORD``."""
    r = shlex.quote(root)
    pat = shlex.quote(_glob_escaped(root))
    return (
        f"root={r}; pat={pat}; "
        'for d in $(find /proc/[0-9]*/cwd -maxdepth 0 \\( -lname "$pat" -o -lname "$pat/*" \\) '
        "-printf '%h\\n' 2>/dev/null); do "
        'printf "P%s\\0" "${d#/proc/}"; '
        'find "$d/fd" -mindepth 1 -maxdepth 1 -lname "$pat/*" -printf "F%l\\0" 2>/dev/null; '
        # Its shared writable mappings: five fields, then the path (which may hold spaces).
        "grep -h -E '^[^ ]+ .w.s ' \"$d/maps\" 2>/dev/null | "
        'while read -r _ _ _ _ _ path; do case $path in "$root"/*) '
        'printf "M%s\\0" "$path";; esac; done; '
        "done; true"
    )


def parse(root: str, out: bytes) -> Leftovers:
    """The look's output, each value checked: a pid is digits, a path is under ``root``
    (a name that is not, or that escapes it, is left out)."""
    pids: list[int] = []
    held: set[str] = set()
    prefix = root.rstrip("/") + "/"
    for rec in out.split(b"\0"):
        m = _RECORD.match(rec)
        if m is None:
            continue
        kind, value = m.group(1), m.group(2)
        if kind == b"P":
            if value.isdigit() and len(value) <= 10 and int(value) not in pids:
                pids.append(int(value))
            continue
        text = value.decode("utf-8", "surrogateescape")
        if kind == b"M":
            text = text.replace("\\012", "\n")
        if not text.startswith(prefix) or text.endswith(" (deleted)"):
            continue
        try:
            rel = confine(root, text)
        except (PathEscapeError, ValueError):
            continue
        if rel != ".":
            held.add(rel)
    return Leftovers(tuple(sorted(pids)), frozenset(held))


def _inner_pid(base: str) -> bytes | None:
    """A process's pid in its innermost PID namespace (``NSpid``'s last field), checked."""
    for line in read_whole(f"{base}/status").splitlines():
        if line.startswith(b"NSpid:"):
            inner = line.split()[-1]
            return inner if inner.isdigit() and len(inner) <= 10 else None
    return None


def host_look(root: str, pidns: int = 0) -> Leftovers:
    """``script``'s look done here, for a workspace whose processes are this host's
    (``space.HostProcesses``: a ``local`` Space, a ``spacesd`` daemon started here): a
    command there costs a whole spawn, most of a call's overhead, where this reads
    ``/proc`` in about a millisecond. ``pidns``: the host pid of a process of the PID
    namespace the Space's processes are in (0: this host's own); then only that
    namespace's processes are looked at, each named by its pid there, as the script run
    in the Space sees and names them. ``OSError`` when that namespace cannot be read."""
    real = os.path.realpath(root)
    prefix = real.rstrip("/") + "/"
    ns = os.readlink(f"/proc/{pidns}/ns/pid") if pidns else None
    out: list[bytes] = []
    mine: frozenset[int] | None = None  # read only when some process is in the workspace
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        base = f"/proc/{name}"
        try:
            cwd = os.readlink(f"{base}/cwd")
            shown = name.encode()
            if ns is not None:
                if os.readlink(f"{base}/ns/pid") != ns:
                    continue  # not the Space's: the script in it never sees it
                inner = _inner_pid(base)
                if inner is None:
                    continue
                shown = inner
        except OSError:
            continue  # gone, or not ours to look at (as the script's find)
        if cwd != real and not cwd.startswith(prefix):
            continue
        mine = _this_line() if mine is None else mine
        if int(name) in mine:
            continue
        out.append(b"P" + shown)
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"{base}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"{base}/fd/{fd}")
                    if target.startswith(prefix):
                        out.append(b"F" + os.fsencode(target))
        with contextlib.suppress(OSError):
            for line in read_whole(f"{base}/maps").splitlines():
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[1][1:2] == b"w" and fields[1][3:4] == b"s":
                    out.append(b"M" + fields[5])
    return parse(real, b"\0".join(out))


def _this_line() -> frozenset[int]:
    """This process and its ancestors (module docstring), from ``/proc/<pid>/stat`` (the
    parent's pid follows the name's closing parenthesis and the state): a few reads, on
    the path of every bash call (psutil's ``parents()`` took milliseconds)."""
    pids: list[int] = []
    pid = os.getpid()
    while pid > 0 and pid not in pids and len(pids) < 64:
        pids.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
            pid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return frozenset(pids)


async def look(space: Space, epoch: int) -> Leftovers:
    """One look in the Space (a command of its user at ``epoch``, in ``/``), or here
    when its processes are this host's (``host_look``)."""
    root = space.root.rstrip("/") or "/"
    if isinstance(space, HostProcesses) and (here := space.host_processes()) is not None:
        with contextlib.suppress(OSError):
            found = host_look(root, here)
            # The same namespace after the look as before it (a daemon that ended and
            # whose pid was taken named another): else the Space is asked.
            if space.host_processes() == here:
                return found
    res = await space.exec(["bash", "-c", script(root)], key=None, epoch=epoch, cwd="/")
    return parse(root, res.output)


async def reread(
    space: Space, table: PathTable, held: frozenset[str]
) -> tuple[PathTable, dict[str, bytes]]:
    """``table`` with each held file that it lists as a file read again (whatever the
    scan's journal or stat key said), and the bytes read, by sha256 (what the image's
    update takes instead of reading them once more). A file gone meanwhile keeps the
    scan's entry: its removal is an event the next scan sees."""
    out = dict(table)
    got: dict[str, bytes] = {}
    for rel in sorted(held):
        entry = table.get(rel)
        if entry is None or entry.kind != "file":
            continue
        try:
            data = await space.read_file(rel)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PathEscapeError):
            continue
        sha = hashlib.sha256(data).hexdigest()
        got[sha] = data
        out[rel] = PathEntry(kind="file", mode=entry.mode, size=len(data), sha256=sha)
    return out, got


def merged(a: Mapping[str, bytes] | None, b: Mapping[str, bytes]) -> dict[str, bytes] | None:
    """Two ``written`` maps in one (None when both are empty)."""
    if not a and not b:
        return None
    return {**(a or {}), **b}
