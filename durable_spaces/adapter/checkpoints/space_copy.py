"""The checkpoints a Space keeps of itself, beside its workspace (``.ds-checkpoints``),
through commands in the Space: writing one, reading one back, pruning them, and
extracting a restore.

The layout is a ``DirectoryCheckpointStore``'s (``<id>.manifest``, ``<id>.tar`` from
older adapters, ``blobs/<sha256>``). Every command carries the caller's epoch, so a
driver paused here and continued after a takeover changes nothing; every path is quoted,
and whatever an agent planted at our names (a symlink, a directory, a FIFO) is removed or
refused, never followed: a read says what it found (``CheckpointCopyError``) and the
caller verifies the bytes it gets against their names anyway.

``prune`` deletes the manifests and tars the log no longer records, then the blobs none
of the recorded manifests names (the caller read those manifests and passes what they
need); killed anywhere, it has only removed what nothing recorded needs.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from collections.abc import Iterable, Mapping

from durable_spaces.adapter.checkpoints import manifest as mf
from durable_spaces.adapter.checkpoints.ids import CheckpointId
from durable_spaces.errors import CheckpointCopyError, SpaceError
from durable_spaces.space import Space

#: Shell function: make ``$1`` a real directory (a symlink or file at its name removed).
_FIX_DIR = (
    'fixdir() { if [ -L "$1" ] || { [ -e "$1" ] && [ ! -d "$1" ]; }; then rm -f -- "$1"; fi; '
    'mkdir -p -- "$1"; }; '
)


def _q(s: str) -> str:
    return shlex.quote(s)


def install(tmp: str, dest: str) -> str:
    """Shell: rename ``tmp`` over ``dest`` (both quoted), even if a directory was planted
    there (``mv`` would move into it); never into a symlink's target."""
    return (
        f"{{ if [ -d {dest} ] && [ ! -L {dest} ]; then rm -rf -- {dest}; fi; "
        f"mv -fT -- {tmp} {dest}; }}"
    )


async def _sh(
    space: Space, script: str, epoch: int, stdin: bytes | None = None
) -> tuple[int | None, bytes]:
    res = await space.exec(["bash", "-c", script], key=None, epoch=epoch, cwd="/", stdin=stdin)
    return res.exit_code, res.output


async def write(
    space: Space, d: str, blobs: Mapping[str, bytes], cid: CheckpointId, data: bytes, epoch: int
) -> None:
    """Write ``blobs`` and then the manifest ``data`` of ``cid`` into the copy at ``d``:
    files synced, blobs in place (and their directory synced) before the manifest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, content in [*((f"blobs/{s}", b) for s, b in blobs.items()), ("m", data)]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o600
            t.addfile(info, io.BytesIO(content))
    tmp = f'"$d"/.tmp-{cid.digest[:16]}'
    code, out = await _sh(
        space,
        f'd={_q(d)}; {_FIX_DIR}fixdir "$d" && fixdir "$d/blobs" && rm -rf -- {tmp} && '
        f"mkdir -- {tmp} && tar --no-same-owner -xf - -C {tmp} || exit 3; "
        f"sync -- {tmp}/m {tmp}/blobs/* 2>/dev/null; "
        f'for f in {tmp}/blobs/*; do [ -f "$f" ] || continue; '
        + install('"$f"', '"$d/blobs/${f##*/}"')
        + ' || exit 4; done; sync -- "$d/blobs" 2>/dev/null; '
        + install(f"{tmp}/m", f'"$d"/{_q(cid + cid.suffix)}')
        + f' || exit 4; sync -- "$d" 2>/dev/null; rm -rf -- {tmp}',
        epoch,
        stdin=buf.getvalue(),
    )
    if code != 0:
        raise SpaceError(f"keeping checkpoint {cid} in the Space failed ({code}): {out[-300:]!r}")


async def write_tar(space: Space, d: str, cid: CheckpointId, data: bytes, epoch: int) -> None:
    """Keep the tar checkpoint ``cid`` (an older adapter's) in the copy at ``d``."""
    tmp = f'"$d"/.tmp-{cid.digest[:16]}'
    code, out = await _sh(
        space,
        f'd={_q(d)}; {_FIX_DIR}fixdir "$d" && rm -rf -- {tmp} && cat > {tmp} && '
        + install(tmp, f'"$d"/{_q(cid + cid.suffix)}'),
        epoch,
        stdin=data,
    )
    if code != 0:
        raise SpaceError(f"keeping checkpoint {cid} in the Space failed ({code}): {out[-300:]!r}")


async def read_file(space: Space, d: str, name: str, epoch: int | None) -> bytes | None:
    """The file ``name`` of the copy (None if absent); a symlink, FIFO or directory
    there is a bad copy, never followed or opened for a blocking read. ``epoch`` None
    reads at the Space's own floor (never raise a Space's epoch to read it)."""
    if epoch is None:
        epoch = max(1, await space.current_epoch())
    code, out = await _sh(
        space,
        f'd={_q(d)}; f="$d"/{_q(name)}; if [ -L "$d" ] || [ -L "$f" ]; then exit 3; '
        f'elif [ ! -e "$f" ]; then exit 4; elif [ ! -f "$f" ]; then exit 5; fi; '
        f'exec dd if="$f" iflag=nofollow,nonblock bs=1M status=none 2>/dev/null',
        epoch,
    )
    if code == 0:
        return out
    if code == 4:
        return None
    why = {3: "a symlink", 5: "not a regular file"}.get(code or 0, f"unreadable (exit {code})")
    raise CheckpointCopyError(why)


async def read_blobs(
    space: Space, d: str, shas: Iterable[str], epoch: int | None
) -> tuple[dict[str, bytes], dict[str, str]]:
    """The blobs of the copy that are regular files (one command): sha -> bytes, and
    sha -> what is wrong for the ones there but not regular files. Absent ones are in
    neither."""
    if epoch is None:
        epoch = max(1, await space.current_epoch())
    names = sorted(s for s in shas if mf.BLOB_NAME.fullmatch(s))
    code, out = await _sh(
        space,
        f'd={_q(d)}; b="$d/blobs"; if [ -L "$d" ] || [ -L "$b" ]; then exit 3; fi; '
        'cd "$b" 2>/dev/null || exit 0; '
        "exec tar --null --no-recursion --ignore-failed-read -T - -cf - 2>/dev/null",
        epoch,
        stdin=b"".join(n.encode() + b"\0" for n in names),
    )
    if code == 3:
        raise CheckpointCopyError("its blobs directory is a symlink")
    if code != 0:
        raise CheckpointCopyError(f"blobs unreadable (exit {code})")
    found: dict[str, bytes] = {}
    bad: dict[str, str] = {}
    if not out.strip(b"\0"):
        return found, bad
    try:
        with tarfile.open(fileobj=io.BytesIO(out), mode="r:") as tar:
            for m in tar:
                if m.name not in names:
                    continue
                f = tar.extractfile(m) if m.isfile() else None
                if f is None:
                    bad[m.name] = "not a regular file"
                else:
                    found[m.name] = f.read()
    except (tarfile.TarError, EOFError) as e:
        raise CheckpointCopyError(f"blobs unreadable: {e}") from None
    return found, bad


async def prune(
    space: Space,
    d: str,
    keep: Iterable[str],
    keep_blobs: Iterable[str] | None,
    epoch: int,
    present: Iterable[str] | None = None,
) -> list[str]:
    """Delete what the copy at ``d`` holds beyond ``keep`` (ids) and, unless None,
    ``keep_blobs``, with leftovers of killed drivers; returns the ids deleted.

    ``present``: the blobs the copy holds as this host listed it (a workspace on this
    host), so the command is sent only the blobs to delete rather than every one to keep
    (~85 KB for 1000 files, the most of a prune's time). Whatever that listing says, only
    blobs outside ``keep_blobs`` are ever deleted; one it missed stays until a later
    prune."""
    names = sorted({_q(CheckpointId.parse(c) + CheckpointId.parse(c).suffix) for c in keep})
    pattern = "|".join(names) or "''"
    doomed: list[str] | None = None
    if keep_blobs is not None and present is not None:
        kept = set(keep_blobs)
        doomed = sorted(b for b in set(present) if mf.BLOB_NAME.fullmatch(b) and b not in kept)
        blobs = "".join(f"{b}\n" for b in doomed)
    else:
        blobs = "" if keep_blobs is None else "\n".join(sorted(set(keep_blobs))) + "\n"
    if keep_blobs is None:
        drop_blobs = ""
    # One ``rm`` for all of them (one per blob was most of a prune under load); the
    # names are hex only, so ``xargs`` splits them as they are.
    elif doomed is not None:  # fd 3: the blobs to delete
        drop_blobs = (
            "[ -d blobs ] && [ ! -L blobs ] && ( cd blobs && grep -xE '[0-9a-f]{64}' <&3 | "
            "xargs -r rm -f -- ); "
        )
    else:  # fd 3: the blobs to keep, put in a file first (never through a name planted
        # there: ``set -C``): the daemon's stdin pipe is not the command's to open again
        # (``/dev/fd/3`` is EACCES where the daemon is root and the command a user: a
        # docker Space's, which then pruned no blob at all)
        drop_blobs = (
            "[ -d blobs ] && [ ! -L blobs ] && ( set -C; cat <&3 > .tmp-keep ) && "
            "( cd blobs && ls -A | "
            "grep -xE '[0-9a-f]{64}' | grep -vxF -f ../.tmp-keep | xargs -r rm -f -- ); "
            "rm -f .tmp-keep; "
        )
    code, out = await _sh(
        space,
        # fd 3: the blobs to keep or to delete (stdin; a pipeline's later commands have
        # their own). Whatever way the script ends, it reads all of it first: a command
        # that exits before reading its input fails the daemon's write (a broken pipe)
        # once the input is more than a pipe holds (1000 blobs to keep).
        f"exec 3<&0; cd {_q(d)} 2>/dev/null || {{ cat >/dev/null; exit 0; }}; "
        "[ -L blobs ] && rm -f blobs; "
        "rm -rf -- .restore-* .tmp-* .probe-*; "
        'for f in *.tar *.manifest .pending-*.tar; do [ -e "$f" ] || [ -L "$f" ] || continue; '
        f'case "$f" in {pattern}) ;; *) rm -rf -- "$f" && printf "%s\\0" "$f";; esac; done; '
        + drop_blobs
        + "cat <&3 >/dev/null; exit 0",
        epoch,
        stdin=blobs.encode() if keep_blobs is not None else None,
    )
    if code != 0:
        raise SpaceError(f"pruning the checkpoints of Space {space.name} failed: {out[-300:]!r}")
    found = []
    for f in out.decode(errors="replace").split("\0"):
        for suffix in (".manifest", ".tar"):
            if f.endswith(suffix) and (cid := CheckpointId.valid(f.removesuffix(suffix))):
                found.append(str(cid))
    return found


async def extract(space: Space, d: str, cid: CheckpointId, data: bytes, epoch: int) -> str | None:
    """Extract the tar ``data`` into a staging directory beside the workspace, then swap
    the contents in: a tar that fails leaves the workspace untouched (returns tar's
    complaint). The root is emptied through a trailing slash, so a root that is a symlink
    to the directory (a local Space pinned to a directory of the machine:
    ``integrations/attempt.py``) is emptied too, not skipped as a link."""
    root = _q(space.root)
    staging = _q(f"{d}/.restore-{cid.digest[:32]}")
    code, out = await _sh(
        space,
        f'{_FIX_DIR}fixdir {_q(d)}; s={staging}; rm -rf -- "$s" && mkdir -p -- "$s" || exit 2; '
        f'tar --no-same-owner -xf - -C "$s" 2>&1 || {{ rm -rf -- "$s"; exit 3; }}; '
        f"mkdir -p -- {root} && find {root}/ -mindepth 1 -delete && "
        f'find "$s" -mindepth 1 -maxdepth 1 -exec mv -t {root} -- {{}} + && '
        f'chmod --reference="$s" -- {root} && touch --reference="$s" -- {root} && '
        f'rmdir -- "$s"',
        epoch,
        stdin=data,
    )
    if code == 3:
        return out[-300:].decode(errors="replace").strip() or "exit 3"
    if code != 0:
        raise SpaceError(f"restore of {cid} failed ({code}): {out[-300:]!r}")
    return None
