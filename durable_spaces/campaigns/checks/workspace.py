"""The workspace as the checker sees it: every node, read without the adapter's scanner.

Where the workspace is a directory of this host (``local``: ``<spaces_dir>/<name>/work``;
``spacesd``: ``<spaces_dir>/<name>/work``; ``Space.root`` is that absolute path), it is
walked with ``os.scandir``/``lstat`` and never through a symlink. Elsewhere (docker,
microvm) a tar of the workspace is streamed out of the Space by one ledger-less command
(``tar -cf - --numeric-owner --format=posix``; POSIX/pax so times keep nanoseconds and
ctime) and parsed with ``tarfile``, never extracted; tar cannot carry sockets, so a
second command lists them.

Everything is visible: bytes, permission bits (0o7777), symlink targets, directories
(empty ones too), fifos, sockets, devices, and the adapter's own ``.ds-*`` temporaries.
The root itself is the node ``"."``.
"""

from __future__ import annotations

import io
import os
import shlex
import stat as st
import tarfile
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from durable_spaces.errors import SpaceError
from durable_spaces.host.files import file_kind
from durable_spaces.space import ExecResult, Space

#: Space kinds whose workspace is a directory of this host (``Capabilities.kind``).
HOST_KINDS = ("local", "process")
#: Space kinds whose file times come from this host's clock (not a guest kernel's).
HOST_CLOCK_KINDS = ("local", "process", "container")

ROOT = "."


@dataclass(frozen=True)
class Node:
    kind: str  # file | dir | symlink | fifo | socket | chardev | blockdev | other
    mode: int  # permission bits, 0o7777
    size: int = 0
    data: bytes | None = None  # files
    target: str | None = None  # symlinks
    mtime_ns: int | None = None
    ctime_ns: int | None = None
    rdev: tuple[int, int] | None = None  # devices: (major, minor)

    @property
    def changed_ns(self) -> int | None:
        """When the node last changed (the later of ctime and mtime; None: unknown)."""
        times = [t for t in (self.ctime_ns, self.mtime_ns) if t is not None]
        return max(times) if times else None


@dataclass
class Workspace:
    nodes: dict[str, Node]
    source: str  # where it was read: "host:<root>", "tar:<root>", "kept:<file>"
    #: Sub-second file times are known (a host walk, or a tar with pax times).
    fine_times: bool = True
    notes: list[str] = field(default_factory=list)  # what could not be read


def _node(s: os.stat_result, **kw: Any) -> Node:
    kind = file_kind(s.st_mode)
    rdev = (os.major(s.st_rdev), os.minor(s.st_rdev)) if kind in ("chardev", "blockdev") else None
    return Node(
        kind,
        st.S_IMODE(s.st_mode),
        s.st_size if kind == "file" else 0,
        mtime_ns=s.st_mtime_ns,
        ctime_ns=s.st_ctime_ns,
        rdev=rdev,
        **kw,
    )


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def walk_host(root: str) -> Workspace:
    """Walk a host directory: lstat everything, follow no symlink, read regular files."""
    nodes: dict[str, Node] = {ROOT: _node(os.lstat(root))}
    if nodes[ROOT].kind != "dir":
        raise SpaceError(f"the workspace {root} is not a directory")
    fd = os.open(root, _DIR_FLAGS)
    try:
        _walk(fd, "", nodes)
    finally:
        os.close(fd)
    return Workspace(nodes, f"host:{root}")


def _walk(dfd: int, prefix: str, nodes: dict[str, Node]) -> None:
    with os.scandir(dfd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        rel = prefix + e.name
        try:
            s = os.lstat(e.name, dir_fd=dfd)
            kind = file_kind(s.st_mode)
            if kind == "symlink":
                nodes[rel] = _node(s, target=os.readlink(e.name, dir_fd=dfd))
            elif kind == "file":
                ffd = os.open(e.name, _FILE_FLAGS, dir_fd=dfd)
                with os.fdopen(ffd, "rb") as f:
                    data = f.read()
                    nodes[rel] = _node(os.fstat(f.fileno()), data=data)
            elif kind == "dir":
                nodes[rel] = _node(s)
                sub = os.open(e.name, _DIR_FLAGS, dir_fd=dfd)
                try:
                    _walk(sub, rel + "/", nodes)
                finally:
                    os.close(sub)
            else:
                nodes[rel] = _node(s)
        except FileNotFoundError:
            continue  # vanished while walking (the Space should be idle; say nothing)


# --- tar ------------------------------------------------------------------------------------


def _ns_text(ns: int) -> str:
    return f"{ns // 10**9}.{ns % 10**9:09d}"


def _pax_ns(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(Decimal(value) * 10**9)
    except ArithmeticError:
        return None


def _rel(name: str) -> str:
    name = name.rstrip("/")
    if name in ("", "."):
        return ROOT
    return name[2:] if name.startswith("./") else name


def parse_tar(data: bytes, source: str = "tar") -> Workspace:
    """A workspace from tar bytes (read in memory; nothing is extracted)."""
    nodes: dict[str, Node] = {}
    fine = True
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar:
            rel = _rel(m.name)
            mtime = _pax_ns(m.pax_headers.get("mtime"))
            ctime = _pax_ns(m.pax_headers.get("ctime"))
            if mtime is None:
                fine = False
                mtime = int(m.mtime) * 10**9
            kw: dict[str, Any] = {"mtime_ns": mtime, "ctime_ns": ctime}
            mode = m.mode & 0o7777
            if m.isreg() or m.islnk():
                f = tar.extractfile(m)
                body = f.read() if f is not None else b""
                nodes[rel] = Node("file", mode, len(body), data=body, **kw)
            elif m.isdir():
                nodes[rel] = Node("dir", mode, **kw)
            elif m.issym():
                nodes[rel] = Node("symlink", mode, target=m.linkname, **kw)
            elif m.isfifo():
                nodes[rel] = Node("fifo", mode, **kw)
            elif m.ischr() or m.isblk():
                kind = "chardev" if m.ischr() else "blockdev"
                nodes[rel] = Node(kind, mode, rdev=(m.devmajor, m.devminor), **kw)
            else:
                nodes[rel] = Node("other", mode, **kw)
    return Workspace(nodes, source, fine_times=fine)


_TAR_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "fifo": tarfile.FIFOTYPE,
    "chardev": tarfile.CHRTYPE,
    "blockdev": tarfile.BLKTYPE,
}


def to_tar(ws: Workspace) -> tuple[bytes, dict[str, Node]]:
    """The workspace as a pax tar (times to the nanosecond), and the nodes tar cannot
    hold (sockets, unknown kinds) for the caller to keep beside it."""
    buf = io.BytesIO()
    rest: dict[str, Node] = {}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, n in sorted(ws.nodes.items()):
            if n.kind not in _TAR_TYPES:
                rest[path] = n
                continue
            info = tarfile.TarInfo("." if path == ROOT else f"./{path}")
            info.type = _TAR_TYPES[n.kind]
            info.mode = n.mode
            info.mtime = (n.mtime_ns or 0) // 10**9
            pax = {}
            if n.mtime_ns is not None:
                pax["mtime"] = _ns_text(n.mtime_ns)
            if n.ctime_ns is not None:
                pax["ctime"] = _ns_text(n.ctime_ns)
            info.pax_headers = pax
            if n.kind == "symlink":
                info.linkname = n.target or ""
            if n.rdev is not None:
                info.devmajor, info.devminor = n.rdev
            body = (n.data or b"") if n.kind == "file" else b""
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if n.kind == "file" else None)
    return buf.getvalue(), rest


def node_to_json(n: Node) -> dict[str, Any]:
    """A node without its bytes (for the few tar cannot hold)."""
    return {
        "kind": n.kind,
        "mode": n.mode,
        "size": n.size,
        "mtime_ns": n.mtime_ns,
        "ctime_ns": n.ctime_ns,
    }


def node_from_json(d: dict[str, Any]) -> Node:
    return Node(
        str(d["kind"]),
        int(d["mode"]),
        int(d.get("size") or 0),
        mtime_ns=d.get("mtime_ns"),
        ctime_ns=d.get("ctime_ns"),
    )


# --- out of a Space ---------------------------------------------------------------------------


async def stream_tar(space: Space) -> Workspace:
    """Tar the workspace inside the Space (ledger-less, at the Space's own floor)."""
    epoch = await space.current_epoch()
    root = shlex.quote(space.root)

    async def sh(script: str) -> ExecResult:
        return await space.exec(["sh", "-c", script], key=None, epoch=epoch, cwd="/")

    fine = True
    res = await sh(f"tar -cf - --numeric-owner --format=posix -C {root} . 2>/dev/null")
    if res.exit_code != 0:  # a tar without pax support: whole seconds only
        fine = False
        res = await sh(f"tar -cf - --numeric-owner -C {root} . 2>/dev/null")
    if res.exit_code != 0:
        raise SpaceError(f"tar of the workspace {space.root} failed (exit {res.exit_code})")
    ws = parse_tar(res.output, f"tar:{space.root}")
    ws.fine_times = ws.fine_times and fine
    socks = await sh(f"cd {root} && find . -type s -print0 2>/dev/null")
    if socks.exit_code != 0:
        ws.notes.append("sockets could not be listed (find failed)")
    for raw in socks.output.split(b"\0"):
        if raw:
            rel = _rel(raw.decode(errors="surrogateescape"))
            ws.nodes[rel] = Node("socket", 0)
    return ws


async def snapshot(space: Space) -> Workspace:
    """The workspace of ``space``: walked on the host where it lives there, else tarred."""
    kind = (await space.capabilities()).kind
    if kind in HOST_KINDS and os.path.isdir(space.root):
        return walk_host(space.root)
    return await stream_tar(space)
