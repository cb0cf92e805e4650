"""The cgroups of a ``local`` Space's epochs: what fences the processes of an old epoch.

Why: ``advance_epoch`` must leave nothing of an older epoch running, or a write of it
lands after a newer driver took over. A process group, a session and an environment mark
(``procs.py``) are containers a command can leave: ``env -i sh -c '...' &`` with
``setsid``, or a double fork, escapes all three. A cgroup v2 (``host/cgroup.py``) cannot
be left by its members, and its children are born in it.

Every command's supervisor is moved into ``<parent>/<instance>/e<epoch>`` by its caller
after the supervisor said its pid and before it is handed its command (``local_space.py``'s
spawn), so the command and everything it starts are born in the cgroup of the epoch it
was started under. ``advance_epoch(n)`` kills every ``e<k>`` with ``k < n`` whole
(``cgroup.kill``), waits until each is empty and removes it, before it writes the new
floor; a restart kills all of them, a delete removes the Space's cgroups with them. The
fork server and the drivers are never in one: an advance kills commands, not the
machinery that starts them.

``parent`` is ``<root>/local-<digest of the state dir>``, with ``root`` the backend's
``cgroup_root`` or else ``host.cgroup.cgroup_root()`` (this process's cgroup, so a
delegated subtree works). The first process to use a state dir records the parent in
``<state_dir>/.cgroup-parent`` and every later one (another driver, a restarted one)
uses the recorded one while it is usable: the processes of one Space are always looked
for where they were put, whatever cgroup the caller itself is in. At a backend's start,
the cgroups of Spaces of its state dir that no longer exist are killed and removed
(``sweep``): a driver that crashed inside a delete leaks them no longer than that.

Where no cgroup can be made (no cgroup v2, no permission), ``why`` says so, every method
here does nothing, and the Space's capabilities say ``process.contained_epochs`` is
missing with that reason: the fence is then ``procs.py``'s alone, with its escape.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import select
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from durable_spaces.backends.local import confine
from durable_spaces.errors import SpaceUnavailableError
from durable_spaces.host import cgroup as host_cgroup
from durable_spaces.host.bounded import MAX_VALUE_BYTES, read_text

__all__ = ["RECORD", "SpaceCgroups", "parent_for", "recorded_parent", "sweep"]

#: The file of a state dir that names where its Spaces' cgroups are.
RECORD = ".cgroup-parent"
#: How long the processes of an epoch may take to die of ``cgroup.kill``.
KILL_TIMEOUT = 10.0

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}")

#: (state dir, explicit root) -> (parent, why not): the probe makes and removes a cgroup.
_resolved: dict[tuple[Path, Path | None], tuple[Path | None, str | None]] = {}
_resolved_lock = threading.Lock()


def _leaf(state_dir: Path) -> str:
    return "local-" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:16]


def _cgroup2_mounts() -> list[Path]:
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts = left.split()
        if right.split()[:1] == ["cgroup2"] and len(parts) >= 5:
            out.append(Path(parts[4]))
    return out


def _recorded(state_dir: Path) -> Path | None:
    """The parent a state dir records, if it is a path this code would have made: under
    a cgroup2 mount, each part a plain name, ending with this state dir's leaf."""
    try:
        raw = read_text(state_dir / RECORD, max_bytes=MAX_VALUE_BYTES)
    except (OSError, ValueError):
        return None
    path = Path(raw.strip())
    if not path.is_absolute() or path.name != _leaf(state_dir):
        return None
    for mount in _cgroup2_mounts():
        try:
            rel = path.relative_to(mount)
        except ValueError:
            continue
        if all(_PART.fullmatch(p) for p in rel.parts):
            return path
    return None


def _record(state_dir: Path, parent: Path) -> None:
    tmp = state_dir / f"{RECORD}.{uuid.uuid4().hex}.tmp"
    try:
        tmp.write_text(f"{parent}\n")
        os.replace(tmp, state_dir / RECORD)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _resolve(state_dir: Path, root: Path | None) -> tuple[Path | None, str | None]:
    if root is not None:  # the caller's choice, used as given (and not recorded)
        why = host_cgroup.unavailable(root)
        return (None, why) if why is not None else (root / _leaf(state_dir), None)
    recorded = _recorded(state_dir)
    if recorded is not None and host_cgroup.unavailable(recorded.parent) is None:
        return recorded, None
    own = host_cgroup.cgroup_root()
    why = host_cgroup.unavailable(own) if own is not None else host_cgroup.unavailable()
    if own is None or why is not None:
        return None, why
    parent = own / _leaf(state_dir)
    if recorded != parent:
        _record(state_dir, parent)
    return parent, None


def recorded_parent(state_dir: Path, root: Path | None = None) -> Path | None:
    """Where an earlier process put this state dir's cgroups, as far as it said so,
    without recording anything (a backend only opened, say by a command refused at its
    first check, leaves its state dir as it found it)."""
    if root is not None:
        return parent_for(state_dir, root)[0]
    return _recorded(state_dir)


def parent_for(state_dir: Path, root: Path | None = None) -> tuple[Path | None, str | None]:
    """Where the Spaces of ``state_dir`` put their epochs' cgroups, or (None, why not)."""
    key = (state_dir, root)
    with _resolved_lock:
        found = _resolved.get(key)
        if found is None:
            found = _resolved[key] = _resolve(state_dir, root)
        return found


def _rmtree(path: Path) -> None:
    """Remove an emptied cgroup and any below it (deepest first)."""
    try:
        subs = [p for p in path.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return
    for sub in subs:
        _rmtree(sub)
    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:  # EBUSY: a task still leaving (it was killed)
            if e.errno != errno.EBUSY:
                raise SpaceUnavailableError(f"cannot remove the cgroup {path}: {e}") from None
            time.sleep(0.001)
    raise SpaceUnavailableError(f"the cgroup {path} stays busy after its kill")


def _kill(paths: list[Path], what: str) -> None:
    """Kill the cgroups ``paths`` whole, wait until each is empty, remove them."""
    for path in paths:
        with _unless_gone():
            (path / "cgroup.kill").write_text("1\n")
    deadline = time.monotonic() + KILL_TIMEOUT
    for path in paths:
        _wait_empty(path, deadline, what)
        _rmtree(path)


@contextlib.contextmanager
def _unless_gone() -> Iterator[None]:
    """Ignore that a cgroup is gone: not found, or removed while one of its files was
    open (ENODEV; another backend's sweep of idle cgroups removes an emptied one)."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENODEV):
            raise


def _says_empty(fd: int) -> bool:
    """Whether the open ``cgroup.events`` file ``fd`` says ``populated 0`` now."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        events = os.read(fd, 4096)
    except OSError as e:
        # ENODEV: the cgroup was removed while we held its file (another advance's
        # kill got there first), and only an empty cgroup can be removed.
        if e.errno in (errno.ENODEV, errno.ENOENT):
            return True
        raise
    return b"populated 0" in events


def _wait_empty(path: Path, deadline: float, what: str) -> None:
    """Until ``cgroup.events`` says ``populated 0`` (a poll on it wakes at each change)."""
    try:
        fd = os.open(path / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            if _says_empty(fd):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise SpaceUnavailableError(f"processes of {what} survived cgroup.kill")
            if not poller.poll(min(left, 0.05) * 1000):
                # Nothing changed for a while: a supervisor moved in after the kill (a
                # restart that went ahead without the lock overtook a spawn) dies too.
                with _unless_gone():
                    (path / "cgroup.kill").write_text("1\n")
    finally:
        os.close(fd)


class SpaceCgroups:
    """The epochs' cgroups of one Space, under ``parent`` (None: none here, ``why``)."""

    def __init__(self, parent: Path | None, why: str | None, instance: str) -> None:
        if parent is not None and not _PART.fullmatch(instance):
            parent, why = None, f"instance {instance!r} is not a plain name"
        #: Why the Space has no cgroups here (None: it has).
        self.why = None if parent is not None else why or "no cgroup parent"
        self.dir = None if parent is None else parent / instance
        self._what = f"Space instance {instance}"

    @property
    def contained(self) -> bool:
        """Whether the Space's commands are put in their epochs' cgroups."""
        return self.dir is not None

    @property
    def unfenced(self) -> str | None:
        """Why a command could leave its epoch's cgroup here (None: it cannot): no cgroups,
        or no fence to keep a command of the cgroups' own uid in them (``confine.py``)."""
        if self.why is not None:
            return self.why
        return confine.unavailable()

    @functools.cached_property
    def fenced_as(self) -> str:
        """The Space's cgroup as ``/proc/self/cgroup`` names it, when its commands are
        fenced in their epochs (what the fork server checks: ``forkserver.py``); else ""."""
        if self.dir is None or self.unfenced is not None:
            return ""
        for mount in _cgroup2_mounts():
            with contextlib.suppress(ValueError):
                return "/" + "/".join(self.dir.relative_to(mount).parts)
        return ""

    def _make(self, path: Path) -> None:
        """Make ``path`` and the levels of ours above it (the package's root under the
        caller's cgroup, the state dir's parent, the Space's), never a level above those:
        a recorded parent under a cgroup that went (a lab run's) is not made again."""
        assert self.dir is not None
        for level in (self.dir.parent.parent, self.dir.parent, self.dir, path):
            with contextlib.suppress(FileExistsError):
                level.mkdir()

    def prepare(self, epoch: int) -> None:
        """Make the cgroup of ``epoch`` (before anything of a command is recorded, so a
        host that refuses fails the spawn with nothing lost)."""
        if self.dir is None:
            return
        path = self.dir / f"e{int(epoch)}"
        for _ in range(3):  # a parent removed as it was made (``sweep``): again
            try:
                self._make(path)
                return
            except FileNotFoundError:
                continue
            except OSError as e:
                raise SpaceUnavailableError(
                    f"cannot make the cgroup {path} of {self._what}: {e.strerror or e}"
                ) from None
        raise SpaceUnavailableError(
            f"the cgroup {path} of {self._what} cannot be made: a level above it is gone"
            " or keeps vanishing"
        )

    def enter(self, epoch: int, pid: int) -> None:
        """Move ``pid`` (a supervisor that waits for its command) into the cgroup of
        ``epoch``, made if need be. A pid already gone is left (its key reads lost)."""
        if self.dir is None:
            return
        path = self.dir / f"e{int(epoch)}"
        for _ in range(3):  # removed meanwhile (a sweep of empty ones, a restart): again
            try:
                self._make(path)
                (path / "cgroup.procs").write_text(f"{int(pid)}\n")
                return
            except FileNotFoundError:
                continue
            except ProcessLookupError:
                return
            except OSError as e:
                raise SpaceUnavailableError(
                    f"cannot put a command of {self._what} into {path}: {e.strerror or e}"
                ) from None
        raise SpaceUnavailableError(
            f"the cgroup {path} of {self._what} cannot be made: a level above it is gone"
            " or keeps vanishing"
        )

    def _all(self) -> list[Path]:
        """Every cgroup directly in the Space's: its epochs', and any other (made by no
        code of ours: a command of a host without the fence)."""
        if self.dir is None:
            return []
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return [self.dir / n for n in names if (self.dir / n).is_dir()]

    def kill_below(self, epoch: int | None) -> None:
        """Kill every cgroup of the Space but ``epoch``'s (all of them: None) whole, with
        the cgroups below them, wait until they are empty, and remove them. Only the
        advance to ``epoch`` calls it: an older epoch's, one named as a later epoch's (made
        ahead of the floor) and any other were all made before the new floor, so none may
        outlive it."""
        keep = None if epoch is None else f"e{int(epoch)}"
        _kill([p for p in self._all() if p.name != keep], self._what)

    def remove(self) -> None:
        """Kill every cgroup of the Space and remove them (the Space is deleted)."""
        if self.dir is not None:
            _kill([self.dir], self._what)

    def pids(self) -> list[int]:
        """Every process in the Space's cgroups now (below its epochs' too)."""
        out: list[int] = []
        for top in self._all():
            for path in [top, *(p for p in top.rglob("*") if p.is_dir())]:
                with _unless_gone():
                    out += [int(x) for x in (path / "cgroup.procs").read_text().split()]
        return out


def _remove_idle(path: Path) -> None:
    """Remove the cgroup ``path`` and those below it when no process is in any of them;
    an ``rmdir`` fails while one is, so a command that just entered one keeps it (and a
    spawn whose cgroup went makes it again: ``SpaceCgroups.enter``)."""
    try:
        if b"populated 0" not in (path / "cgroup.events").read_bytes():
            return
        subs = [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return
    for sub in subs:
        _remove_idle(sub)
    with contextlib.suppress(OSError):
        path.rmdir()


def sweep(state_dir: Path, parent: Path | None) -> None:
    """Kill and remove the cgroups of Spaces of ``state_dir`` that no longer exist, and
    remove the idle cgroups of other state dirs (a test's, removed with its Spaces):
    whose they are cannot be told from here, but nothing runs in them."""
    if parent is None:
        return
    with contextlib.suppress(OSError):
        for other in os.listdir(parent.parent):
            if other.startswith("local-") and other != parent.name:
                _remove_idle(parent.parent / other)
    try:
        found = [n for n in os.listdir(parent) if _PART.fullmatch(n)]
    except OSError:
        return
    if not found:
        return
    live = set()
    try:
        entries = list(state_dir.iterdir())
    except OSError:
        return  # no telling which Spaces exist: nothing is removed
    for d in entries:
        with contextlib.suppress(OSError, ValueError):
            live.add(read_text(d / "instance", max_bytes=MAX_VALUE_BYTES).strip())
    for name in found:
        if name not in live and (parent / name).is_dir():
            with contextlib.suppress(SpaceUnavailableError):  # the next start tries again
                SpaceCgroups(parent, None, name).remove()
