"""Workspace mutations of a daemon-backed Space: one shell script, run as one command.

The daemon's file API has no epoch field, its commands do: so every write, symlink and
remove is one command carrying the caller's epoch. A stale one is refused before it
starts; one still running when the floor rises is killed by the advance, and its
temporary never reaches the workspace. ``mutate_argv`` builds the command and
``mutate_error`` reads its exit status back as the error a local file operation raises.
"""

from __future__ import annotations

import errno

from durable_spaces.errors import PathEscapeError, SpaceError
from durable_spaces.space import ExecResult

#: The one script every workspace mutation runs (arguments only, never interpolated):
#: ``op root staging arg component...``. It walks from the root one component at a time,
#: refusing any symlink on the way (as local_fs does with O_NOFOLLOW), creating missing
#: directories for write/symlink, then acts on the last component without following it.
#: A write goes to a temporary in ``staging`` (beside the workspace, same filesystem) and
#: is renamed into place: a kill leaves the old file or the new, and nothing in the
#: workspace. There is a window between a component's check and the next step that a
#: concurrent hostile command could use; the daemon has no openat-style API to close it.
MUTATE = r"""
op=$1 root=$2 stage=$3 arg=$4; shift 4
cd -P -- "$root" || exit 90
while [ $# -gt 1 ]; do
  c=$1; shift
  [ -L "$c" ] && { echo "symlink: $c" >&2; exit 91; }
  if [ ! -e "$c" ]; then
    [ "$op" = remove ] && exit 0
    mkdir -- "$c" 2>/dev/null || [ -d "$c" ] || exit 92
    [ -L "$c" ] && exit 91
  fi
  cd -P -- "$c" 2>/dev/null || exit 93
done
leaf=$1
case $op in
write)
  [ -d "$leaf" ] && [ ! -L "$leaf" ] && exit 94
  mode=${arg%:*} size=${arg#*:}
  if [ -z "$mode" ]; then
    if [ -f "$leaf" ] && [ ! -L "$leaf" ]; then mode=$(stat -c %a -- "$leaf"); else mode=644; fi
  fi
  mkdir -p -- "$stage" && tmp=$(mktemp -p "$stage" .w.XXXXXXXX) || exit 95
  if cat > "$tmp" && [ "$(stat -c %s -- "$tmp")" = "$size" ] && chmod -- "$mode" "$tmp" &&
     mv -fT -- "$tmp" "$leaf"; then exit 0; fi
  rm -f -- "$tmp"; exit 96 ;;
symlink)
  [ -d "$leaf" ] && [ ! -L "$leaf" ] && exit 94
  mkdir -p -- "$stage" && tmp=$(mktemp -u -p "$stage" .l.XXXXXXXX) || exit 95
  if ln -s -- "$arg" "$tmp" && mv -fT -- "$tmp" "$leaf"; then exit 0; fi
  rm -f -- "$tmp"; exit 96 ;;
remove)
  [ -e "$leaf" ] || [ -L "$leaf" ] || exit 0
  if [ -d "$leaf" ] && [ ! -L "$leaf" ]; then
    if [ "$arg" = r ]; then rm -rf -- "$leaf" || exit 96
    else rmdir -- "$leaf" 2>/dev/null || exit 98; fi
  else rm -f -- "$leaf" || exit 96; fi ;;
esac
"""
MUTATE_ERRORS: dict[int, tuple[type[OSError], int, str]] = {
    90: (FileNotFoundError, errno.ENOENT, "the workspace is missing"),
    92: (OSError, errno.EIO, "cannot create a parent directory"),
    93: (NotADirectoryError, errno.ENOTDIR, "a parent is not a directory"),
    94: (IsADirectoryError, errno.EISDIR, "is a directory"),
    98: (OSError, errno.ENOTEMPTY, "directory not empty"),
}


def mutate_argv(op: str, root: str, staging: str, arg: str, rel: str) -> list[str]:
    """The command of one mutation ``op`` of the workspace-relative path ``rel``."""
    return ["sh", "-c", MUTATE, "ds-mutate", op, root, staging, arg, *rel.split("/")]


def mutate_error(op: str, path: str, res: ExecResult) -> Exception:
    """Why mutation ``op`` of ``path`` failed, from its command's result (not a stale
    epoch: the caller checks the floor first)."""
    why = res.output.decode(errors="replace").strip()[-300:]
    if res.exit_code == 91:
        return PathEscapeError(f"refusing to go through a symlink ({path!r}): {why}")
    err = MUTATE_ERRORS.get(res.exit_code or 0)
    if err is not None:
        return err[0](err[1], f"{op} {path!r}: {why or err[2]}")
    return SpaceError(f"{op} {path!r} failed ({res.exit_code}, signal {res.signal}): {why}")


#: How the daemon reports bytes sent to a command that no longer reads them: it exited
#: first, or closed its stdin (the write then fails on a broken pipe). Either way a
#: mutation's command stopped before taking its bytes, and its exit status says why.
_STOPPED_READING = ("process has exited", "Broken pipe")


def stopped_reading(e: SpaceError) -> bool:
    """Whether feeding a mutation's bytes failed because its command stopped reading
    them (refused before reading: a symlink on the way), not because the Space failed."""
    return any(m in str(e) for m in _STOPPED_READING)
