"""Tar checkpoints: the checks every archive passes before it is extracted.

Older adapters kept each workspace checkpoint as one tar (``<id>.tar``); restores of
manifests (``manifest.to_tar``) go through the same extraction. An archive is refused
(``PathEscapeError``) when it could write outside the workspace: names that are absolute
or climb out, members under a symlink member, hard links to anything but an earlier file
or symlink member, devices, FIFOs and sockets.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import tarfile

from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.errors import PathEscapeError


def check_archive(data: bytes) -> None:
    """Refuse an archive that could write outside the workspace when extracted: names
    that are absolute or climb out, members under a symlink member, hard links to
    anything but an earlier file or symlink member, devices, FIFOs and sockets."""
    links: set[str] = set()
    seen: dict[str, str] = {}  # earlier members that a hard link may name: name -> kind
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar.getmembers():
            name = _inside(m.name, m.name, "checkpoint member escapes the workspace")
            if name == ".":
                continue
            if _under(name, links):
                raise PathEscapeError(f"checkpoint member under a symlink: {m.name!r}")
            if m.islnk():
                target = _inside(m.linkname, m.name, "hard link out of the workspace")
                kind = seen.get(target)
                if kind is None or _under(target, links):
                    raise PathEscapeError(
                        f"hard link to no earlier file of the checkpoint: {m.name!r} -> "
                        f"{m.linkname!r}"
                    )
                if kind == "symlink":
                    links.add(name)
                seen[name] = kind
            elif m.issym():
                links.add(name)
                seen[name] = "symlink"
            elif m.isfile():
                seen[name] = "file"
            elif not m.isdir():
                raise PathEscapeError(f"special file in checkpoint: {m.name!r}")
            else:
                seen.pop(name, None)


def _inside(raw: str, member: str, why: str) -> str:
    name = posixpath.normpath(raw) if raw else "."
    if name.startswith("/") or name == ".." or name.startswith("../"):
        raise PathEscapeError(f"{why}: {member!r}")
    return name


def _under(name: str, links: set[str]) -> bool:
    parts = name.split("/")
    return any("/".join(parts[:i]) in links for i in range(1, len(parts)))


def archive_problem(cid: CheckpointId, data: bytes) -> str | None:
    """What is wrong with ``data`` as the checkpoint ``cid`` (None: it is intact)."""
    if not cid.matches(data):
        actual = hashlib.sha256(data).hexdigest()
        return f"content does not match its id (sha256 {actual[:16]}..., {len(data)} bytes)"
    try:
        check_archive(data)
    except PathEscapeError as e:
        return f"archive refused: {e}"
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        return f"not a readable tar: {e}"
    return None
