"""A change journal that runs inside the Space, next to its daemon: for the Spaces whose
workspace this host cannot see (a microvm's; a spacesd or docker Space where the host
scan is off), so a scan costs what changed, not a ``find`` of the whole workspace.

Why: under TCG a ``find`` of the workspace through the daemon is slow and a
transactional call made two, where a request to a process already running in the guest
answers in a small fraction of that (docs/performance.md). So each epoch starts one
helper (``guest_journal.pl``, perl-base only) as a command of the Space's user under the helper
epoch (the next advance kills it, as it does every command of an older epoch) and keeps talking
to it over its stdin and stdout: a request is a nonce; the first answer is a walk of the whole
workspace, each later one the paths its inotify events named since, looked at again in the
guest (stat, link target, and the bytes of the small files, hashed here and kept for
``read_files``).

Soundness is the host journal's (``local/journal.py``), argued in the helper's header;
here: an answer counts only when it ends with its own nonce and says it is trusted, the
daemon's boot id is the one the helper started under, and nothing failed on the way.
Anything else (the helper gone or refused, a restart, a restore, a new epoch, a timeout)
drops the journal: the next scan starts a new helper, whose first answer is a full walk;
if no helper starts at all (no perl), the Space scans its own way (``spacesd.scan``).
``DS_SPACE_JOURNAL=0`` turns it off; the mutant ``journal_miss`` has the helper drop the
events that say a file's contents changed.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib import resources
from typing import Any

from durable_spaces.backends.spacesd.scan import unrepresentable
from durable_spaces.chaos import mutants
from durable_spaces.errors import SpaceUnavailableError
from durable_spaces.space import PathEntry

__all__ = ["SCRIPT", "GuestJournal"]

#: The helper's source, run as ``perl -e``.
SCRIPT = (resources.files(__package__) / "guest_journal.pl").read_text()
#: Watches one helper may hold (files + directories); a bigger tree is scanned in full
#: (as the host journal's ``MAX_WATCHES``; the microvm guest allows 65536 a user).
MAX_WATCHES = 50_000
#: A helper asked nothing for this long exits (a Space object never closed must not leave
#: it running for good); the next scan then starts another, with a full walk.
IDLE_SECONDS = 600
#: What a frame may hold beyond a small file's bytes (its path, a link's target).
FRAME_SLACK = 1 << 20
#: How long a helper may say nothing while an answer is due: it speaks at least once a
#: second while it works (K frames), so this much silence is a stopped helper (a pause, a
#: stopped machine), and the scan is the daemon's own after it, not a wait without end.
SILENCE_TIMEOUT = 20.0
#: How often a wait on the helper looks whether its daemon is still the one it started
#: under (the backend's probe, no request): the SDK keeps retrying a dead daemon's
#: connection for seconds before a write to the helper fails, and a Space removed or
#: restarted under a call cost it that much.
DAEMON_LOOK_S = 0.1

#: Helpers in a row that gave no first answer before this object stops starting them (no
#: perl in the Space, a script it refuses): its scans are the Space's own from then on.
GIVE_UP = 2
#: Starts the helper: (argv) -> a running command with stdin open (``SpacesdExecution``).
Start = Callable[[Sequence[str]], Awaitable[Any]]
#: Hashes files in the Space: (workspace paths) -> their sha256 (those it could hash).
HashFiles = Callable[[list[str]], Awaitable[dict[str, str]]]

_LEN = struct.Struct(">I")
_FILE_HEAD = struct.Struct(">IQb")


class Untrusted(Exception):
    """The journal cannot vouch for its answer (why in the message)."""


class Hidden(Untrusted):
    """The helper cannot vouch for now (a mount at or under the workspace) and stays:
    the scan is the daemon's own, and the helper's next trusted answer is a new walk."""


def _well_formed(rel: str) -> bool:
    """A workspace-relative path as a walk names it: ``.``, or non-empty components
    that are neither ``.`` nor ``..`` (no leading, trailing or doubled slash)."""
    return rel == "." or all(p not in ("", ".", "..") for p in rel.split("/"))


def _ancestors(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


class _Reader:
    """Length-prefixed fields of one frame body."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.at = 0

    def blob(self) -> bytes:
        if self.at + 4 > len(self.body):
            raise Untrusted("a frame of the journal was cut short")
        (n,) = _LEN.unpack_from(self.body, self.at)
        start = self.at + 4
        self.at = start + n
        if self.at > len(self.body):
            raise Untrusted("a frame of the journal was cut short")
        return self.body[start : self.at]

    def file_head(self) -> tuple[int, int, int]:
        if self.at + _FILE_HEAD.size > len(self.body):
            raise Untrusted("a frame of the journal was cut short")
        out = _FILE_HEAD.unpack_from(self.body, self.at)
        self.at += _FILE_HEAD.size
        return out


class GuestJournal:
    """One Space object's journal in the Space (module doc). ``entries`` is the whole
    workspace as the last trusted answer left it (files with their sha256, symlinks),
    by workspace path; ``kept`` the bytes the last answer carried."""

    def __init__(
        self,
        root: str,
        start: Start,
        hash_files: HashFiles,
        boot_id: Callable[[], str | None],
        keep_max: int,
        keep_total: int,
        stats: dict[str, int] | None = None,
        user: str = "",
        journal: bool = True,
    ) -> None:
        self._root = root
        #: ``Settings.space_journal``: off, no helper runs and the caller scans its way.
        self._on = journal
        #: The Space's user, whose effective ids the helper takes ("": none, it runs as
        #: it was started).
        self._user = user
        self._start = start
        self._hash = hash_files
        self._boot_id = boot_id
        self._keep = (keep_max, keep_total)
        self._ex: Any = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._buf = bytearray()
        self._boot: str | None = None
        self._lock = asyncio.Lock()
        self.entries: dict[str, PathEntry] = {}
        #: ``unrepresentable`` of the entries it is not None for (``scan.table_of``).
        self.cuts: dict[str, tuple[str, str]] = {}
        #: How many entries each directory holds, at any depth (what ``_drop`` walks).
        self._under: dict[str, int] = {}
        self.kept: dict[str, bytes] = {}
        #: Why the last answer was a full walk (or why there was none).
        self.why_full = "no scan yet"
        #: A helper that could not start is not tried again by this object.
        self.unavailable: str | None = None
        self._failed_first = 0
        #: Whether the running helper gave a good answer, and its walk.
        self._answered = self._walked = False
        #: ``guest_full`` (walks), ``guest_journal`` (later answers), ``guest_relooked``
        #: (their frames), and ``hashed`` (files read and hashed, every scan's counter):
        #: added to the caller's counters, apart from a host journal's ``full`` and
        #: ``journal`` beside them (``host_scan``).
        self.stats = stats if stats is not None else {}
        for k in ("guest_full", "guest_journal", "guest_relooked", "hashed"):
            self.stats.setdefault(k, 0)

    # --- the helper ------------------------------------------------------------------

    async def _launch(self) -> None:
        keep_max, keep_total = self._keep
        argv = ["perl", "-e", SCRIPT, self._root, str(keep_max), str(keep_total)]
        argv += [str(MAX_WATCHES), str(IDLE_SECONDS), self._user]
        if mutants.active("journal_miss"):
            argv.append("miss")
        self._boot = self._boot_id()
        self._ex = await self._start(argv)
        self._chunks = self._ex.output().__aiter__()
        self._buf = bytearray()

    async def reset(self, why: str) -> None:
        """Trust nothing seen so far: the helper is let go (its stdin closed, so it ends;
        an advance kills it anyway) and the next scan starts another."""
        async with self._lock:
            await self._drop_helper(why)

    async def _drop_helper(self, why: str) -> None:
        ex, self._ex, self._chunks = self._ex, None, None
        self._answered = self._walked = False
        self._drop(".")
        self.kept = {}
        self.why_full = why
        if ex is not None and self._boot_id() == self._boot:  # else it died with its daemon
            try:
                await self._while_daemon(ex.close_input(), 5)
                await self._while_daemon(ex.detach(), 5)
            except Exception:  # the daemon or the helper is gone already: nothing to end
                pass

    async def _while_daemon(self, aw: Awaitable[Any], timeout: float) -> Any:
        """``aw``, given up (``SpaceUnavailableError``) as soon as the daemon the helper
        started under is down or another (``DAEMON_LOOK_S``), and after ``timeout``
        (``TimeoutError``)."""
        task = asyncio.ensure_future(aw)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                left = deadline - loop.time()
                done, _ = await asyncio.wait({task}, timeout=max(0.0, min(DAEMON_LOOK_S, left)))
                if done:
                    return task.result()
                if self._boot_id() != self._boot:
                    raise SpaceUnavailableError("the daemon the journal's helper ran under is gone")
                if left <= 0:
                    raise TimeoutError
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            assert self._chunks is not None
            try:
                chunk = await self._while_daemon(self._chunks.__anext__(), SILENCE_TIMEOUT)
            except StopAsyncIteration:
                raise Untrusted("the journal's helper exited") from None
            except TimeoutError:
                raise Untrusted(
                    f"the journal's helper said nothing for {SILENCE_TIMEOUT:g} s (stopped?)"
                ) from None
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def _answer(self, nonce: str) -> list[tuple[str, bytes]]:
        frames: list[tuple[str, bytes]] = []
        while True:
            head = await self._read(5)
            kind = chr(head[0])
            (n,) = _LEN.unpack_from(head, 1)
            if n > self._keep[0] + FRAME_SLACK:  # a file's bytes and two paths at most
                raise Untrusted(f"a frame of {n} bytes from the journal")
            body = await self._read(n)
            if kind == "K":  # still working
                continue
            if kind in "TDLFB":
                frames.append((kind, body))
                continue
            if kind != "E":  # not the helper's speech: nothing after it can be trusted
                raise Untrusted(f"an unknown frame {kind!r} from the journal")
            r = _Reader(body)
            got, why = _text(r.blob()), _text(r.blob())
            if got != nonce:
                raise Untrusted("the journal answered another request")
            if why.startswith("~"):
                raise Hidden(why[1:])
            if why:
                raise Untrusted(why)
            return frames

    async def _ask(self, kind: str = "") -> list[tuple[str, bytes]]:
        """One answer's frames: to a scan (``kind`` "": a new helper's first is a full
        walk) or to a boot id's request ("?")."""
        if self._ex is None:
            await self._launch()
        nonce = secrets.token_hex(8)
        await self._while_daemon(self._ex.send(f"{kind}{nonce}\n".encode()), SILENCE_TIMEOUT)
        frames = await self._answer(nonce)
        if self._boot_id() != self._boot:
            raise Untrusted("the Space's daemon restarted")
        return frames

    async def boot_id(self) -> str | None:
        """The machine's boot id, read now by the helper: a process of that boot (a
        machine that booted again has none, a restored one is another daemon), so a
        request where a command would cost several times more under TCG. A helper is
        started for it if none runs (its first scan is still a walk): checkpoint mode reads the
        id twice a call and scans never. None when it gives no good answer (dropped then): the
        caller reads the id its own way."""
        if self.unavailable is not None or not self._on:
            return None
        async with self._lock:
            try:
                frames = await self._ask("?")
                if [k for k, _ in frames] != ["B"]:
                    raise Untrusted("the journal's answer holds no boot id")
                boot = _text(_Reader(frames[0][1]).blob()).strip()
                if not (0 < len(boot) <= 64 and boot.isascii() and boot.isprintable()):
                    raise Untrusted(f"a boot id that is not one: {boot[:80]!r}")
            except Exception as e:
                await self._failed(e)
                return None
            self._answered = True
            return boot

    # --- the table -------------------------------------------------------------------

    def _put(self, rel: str, entry: PathEntry) -> None:
        if rel not in self.entries:
            for d in _ancestors(rel):
                self._under[d] = self._under.get(d, 0) + 1
        self.entries[rel] = entry
        cut = unrepresentable(rel)
        if cut is not None:
            self.cuts[rel] = cut
        else:
            self.cuts.pop(rel, None)

    def _pop(self, rel: str) -> None:
        if self.entries.pop(rel, None) is None:
            return
        self.cuts.pop(rel, None)
        for d in _ancestors(rel):
            n = self._under[d] - 1
            if n:
                self._under[d] = n
            else:
                del self._under[d]

    def _drop(self, rel: str) -> None:
        """``rel`` and everything under it (``.``: everything) left the workspace."""
        if rel == ".":
            self.entries.clear()
            self.cuts.clear()
            self._under.clear()
            return
        self._pop(rel)
        if rel in self._under:  # entries below: a directory went (rare; it walks them all)
            prefix = rel + "/"
            for k in [k for k in self.entries if k.startswith(prefix)]:
                self._pop(k)

    def _apply(self, frames: list[tuple[str, bytes]]) -> list[str]:
        """Frames into ``entries`` and ``kept``; the files still to hash in the Space."""
        kept: dict[str, bytes] = {}
        unhashed: list[str] = []
        for kind, body in frames:
            r = _Reader(body)
            rel = _text(r.blob())
            if not _well_formed(rel) or (rel == "." and kind != "T"):  # an image path to be
                raise Untrusted(f"the journal named a path that is not the workspace's: {rel!r}")
            if kind == "T":
                self._drop(rel)
            elif kind == "D":
                self._pop(rel)
            elif kind == "L":
                self._put(rel, PathEntry(kind="symlink", mode=0o777, target=_text(r.blob())))
            elif kind == "F":
                mode, size, has = r.file_head()
                data = r.blob()
                sha = None
                if has:
                    sha = hashlib.sha256(data).hexdigest()
                    kept[rel] = data
                else:
                    unhashed.append(rel)
                self._put(rel, PathEntry(kind="file", mode=mode & 0o777, size=size, sha256=sha))
            else:
                raise Untrusted(f"an unknown frame {kind!r} from the journal")
        self.kept = kept
        self.stats["hashed"] += len(kept)
        return unhashed

    async def _hash_rest(self, unhashed: list[str]) -> None:
        hashes = await self._hash(unhashed) if unhashed else {}
        for rel in unhashed:
            e = self.entries.get(rel)
            if e is None:
                continue
            if rel in hashes:
                self.entries[rel] = PathEntry("file", e.mode, e.size, hashes[rel])
            else:  # as a daemon scan: a file it could not hash is not in the table
                self._drop(rel)
        self.stats["hashed"] += len(unhashed)

    async def scan(self) -> dict[str, PathEntry] | None:
        """The whole workspace (files with sha256, symlinks) as of now, or None: the
        caller scans its own way (``why_full`` says why)."""
        if self.unavailable is not None or not self._on:
            return None
        async with self._lock:
            walk = not self._walked  # a helper's first scan answer is a walk
            try:
                frames = await self._ask()
                unhashed = self._apply(frames)
                await self._hash_rest(unhashed)
            except Hidden as e:  # the helper stays; nothing it knew is trusted
                self._drop(".")
                self.kept = {}
                self.why_full = str(e)
                self._answered, self._walked = True, False
                return None
            except Exception as e:  # the daemon's own errors: the caller's scan says them
                last = dict(self.entries) if mutants.active("journal_loss_trusted") else {}
                await self._failed(e)
                return last or None
            self._answered = self._walked = True
            self._failed_first = 0
            self.stats["guest_full" if walk else "guest_journal"] += 1
            self.stats["guest_relooked"] += 0 if walk else len(frames)
            if not walk:
                self.why_full = ""
            return self.entries

    async def _failed(self, e: Exception) -> None:
        """Drop the helper after ``e``. One that started and never gave a good answer
        (it exited, or spoke no answer) counts towards GIVE_UP; a daemon down or gone
        does not."""
        down = isinstance(e, SpaceUnavailableError)
        self._failed_first += self._ex is not None and not self._answered and not down
        why = str(e) if isinstance(e, Untrusted) else f"the journal failed: {e!r}"
        await self._drop_helper(why)
        if self._failed_first >= GIVE_UP:
            self.unavailable = f"the journal's helper gave no first answer: {why}"
